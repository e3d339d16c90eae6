"""One token's verdict under the array checks (``checked_matcher.py``): whether writing it
next keeps every check, and keeps the array a way to meet them.

``TokenLookahead.allows`` feeds the token's bytes to a copy of the scan (the checks refuse
a repeat, a match too many, an array closed short), then looks ahead from there, in the
innermost checked array:

- over a finite item domain, an item no value still allowed starts with (or a ``,`` when
  none is left) is refused (``CheckPlan.values_left``);
- an item that must match a ``contains`` must be a prefix of a matching item
  (``ContainsSteering.matching_ahead``);
- in a ``uniqueItems`` array, a literal repeating an item is refused at its first letter,
  a number repeating one where the backend lets it go no further (``_number_goes_on``);
- with llguidance, a token after which the bytes the grammar forces complete a repeat.

Example::

    lookahead = TokenLookahead(followed, plan, reach, steering, vocab.width)
    refused = [t for t in candidates if not lookahead.allows(t)]
"""

from __future__ import annotations

import bisect
import json
import math
from typing import TYPE_CHECKING

import numpy as np

from constrained.grammars.checked_text import innermost_checked
from constrained.grammars.matcher import words_for
from constrained.schema.array_checks import canonical, canonical_text
from constrained.schema.json_scan import SCALAR, VALUE, Frame, Scan

if TYPE_CHECKING:
    import torch

    from constrained.grammars.checked_contains import ContainsSteering
    from constrained.grammars.checked_text import FollowedText
    from constrained.schema.array_checks import CheckPlan
    from constrained.schema.json_scan import TokenReach

MAX_LEFT = 64  # array states whose values left are remembered (the last steps' only)
_LITERAL_OF = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}


class TokenLookahead:
    """One request's per-token look-aheads (``allows``)."""

    def __init__(
        self,
        followed: FollowedText,
        plan: CheckPlan,
        reach: TokenReach,
        steering: ContainsSteering,
        width: int,
    ) -> None:
        self.followed = followed
        self.plan = plan
        self.reach = reach
        self.steering = steering
        self.width = width
        self.scratch: torch.Tensor | None = None  # a mask row for the number look-ahead
        self._words: np.ndarray | None = None  # its memory
        self._left: dict[tuple, list[bytes]] = {}  # ``_values_left`` by array state

    def allows(self, token: int) -> bool:
        """Whether ``token`` keeps every check (and, over a finite ``enum``, an unused value
        reachable)."""
        followed = self.followed
        piece = followed.pieces[token]
        trial = followed.trial(piece)
        if trial is None:
            return False
        if self.plan.dead_arrays and any(
            f.rules is not None and not self.plan.satisfiable(f.rules) for f in trial.stack
        ):
            return False  # it opens an array no items can make meet its checks
        index = innermost_checked(trial)  # the array the look-aheads are about
        if index is None:
            return True
        return (
            self.steering.matching_ahead(trial, index, piece)
            and self._unused_value_ahead(trial, index, piece)
            and self._number_goes_on(trial, index, token)
            and not (self._replaying(trial, index, piece) and followed.forced_into_break(token))
        )

    def _replaying(self, trial: Scan, index: int, piece: bytes) -> bool:
        """After ``piece``, the item being written (of the innermost ``uniqueItems`` array)
        is a proper prefix of an earlier item as written (``RowClearing``'s replays' test,
        for a token that also completed something, as ``","+`` after ``["+`` does)."""
        frame = trial.stack[index]
        if not frame.rules.unique or not frame.raw or not trial.in_item(index):
            return False
        written = self.followed.item_text(frame.item_start, piece)
        if not any(len(raw) > len(written) and raw.startswith(written) for raw in frame.raw):
            return False
        return self.followed.inner.forced_bytes() is not None

    def _unused_value_ahead(self, trial: Scan, index: int, piece: bytes) -> bool:
        frame = trial.stack[index]
        finite = frame.rules.finite
        if finite is None:
            return True
        left = self._values_left(frame)
        if trial.in_item(index):
            written = self.followed.item_text(frame.item_start, piece)
            at = bisect.bisect_left(left, written)  # sorted: the values it starts, from here
            return at < len(left) and left[at].startswith(written)
        if index == len(trial.stack) - 1 and trial.mode == VALUE and frame.count:
            return bool(left)  # after a ',': an item must come
        return True

    def _values_left(self, frame: Frame) -> list[bytes]:
        """The values (JSON bytes, sorted) of a finite item domain the next item may take
        and the array still be completed (``CheckPlan.values_left``)."""
        memo = (id(frame.rules), frame.count, frame.seen, frame.matched, frame.loose)
        left = self._left.get(memo)
        if left is None:
            left = self.plan.values_left(
                frame.rules, frame.count, frame.seen, frame.matched, frame.loose
            )
            if len(self._left) >= MAX_LEFT:  # states of the last steps only
                self._left.clear()
            self._left[memo] = left
        return left

    def _number_goes_on(self, trial: Scan, index: int, token: int) -> bool:
        """After ``token``, a scalar item of a ``uniqueItems`` array being written: a literal
        that repeats an earlier item is refused at its first letter; a number that would
        repeat one if it ended there is allowed only where the backend lets it go on (a
        digit, ``.``, an exponent), else refused now (its only way on would be the repeat);
        in its exponent, a 0 or an infinity stays one, so repeating it is refused there."""
        if index != len(trial.stack) - 1 or trial.mode != SCALAR:
            return True
        frame = trial.stack[index]
        if not frame.rules.unique:
            return True
        written = self.followed.item_text(frame.item_start, self.followed.pieces[token])
        if trial.literal:  # true / false / null: decided by their first letter
            return canonical_text(_LITERAL_OF[written[0]]) not in frame.seen
        value = _number_value(written)
        # In the exponent, 0 and infinity stay what they are (the exponent tested first:
        # isinf overflows on a long integer, which has none)
        if b"e" in written.lower() and value is not None and (value == 0 or math.isinf(value)):
            return canonical(value) not in frame.seen
        if value is None or canonical(value) not in frame.seen:
            return True
        return self._backend_goes_on(token)

    def _backend_goes_on(self, token: int) -> bool:
        """Whether, after ``token``, the backend allows a byte that continues a number."""
        inner = self.followed.inner
        if inner.try_consume([token]) != 1:
            return True
        try:
            words = self._scratch_words()
            inner.fill(self.scratch, 0)
            return bool((words.view(np.uint32) & self.reach.next_in_number()[: len(words)]).any())
        finally:
            inner.rollback(1)

    def _scratch_words(self) -> np.ndarray:
        """A one-row host bitmask (``self.scratch``) and its words, read through numpy (a
        host buffer: no device involved)."""
        if self.scratch is None:
            import torch

            self._words = np.zeros((1, words_for(self.width)), np.int32)
            self.scratch = torch.from_numpy(self._words)
        return self._words[0]


def _number_value(written: bytes) -> float | int | None:
    """The value of a number item written so far, were it to end here (``None``: not a
    number yet, as ``-``, ``1e``, ``0e+``); with a zero mantissa, 0 whatever exponent
    follows."""
    try:
        value = json.loads(written)
    except ValueError:  # not a number yet ("-", "1e", "0e+")
        value = None
    lower = written.lower()
    if b"e" in lower:  # in the exponent, 0 and infinity stay what they are
        head = lower.split(b"e")[0]
        if head.strip(b"-").strip(b"0.") == b"":  # a zero mantissa: 0 whatever comes
            value = 0
    return value
