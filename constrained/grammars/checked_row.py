"""Clearing a row the layers below wrote of the tokens that would break an array check or
leave the array no way to meet it (``checked_matcher.py``).

``RowClearing.clear`` reads few tokens one by one: the row ANDed with the tokens that may
complete an item, or close or open an array, from where the text is
(``json_scan.TokenReach``; over a finite item domain, every allowed token), each judged by
``TokenLookahead.allows``. In a ``uniqueItems`` string item, the tokens that would close it
as a repeat are looked up by their text instead (``_string_repeats``). With llguidance, a
token that keeps the item a prefix of an earlier one is refused where the bytes the grammar
then forces complete the repeat (``_replays``). Then ``ContainsSteering`` narrows the row to
matching items where one must come, and clears forced matches past ``maxContains``.

Example::

    clearing = RowClearing(followed, plan, reach, lookahead, steering)
    words = bitmask[row].numpy().view(np.uint32)
    clearing.clear(words)   # in place; empty only through a bug (CheckedMatcher.stuck)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from constrained.grammars.checked_text import MAX_PIECE, has_token, innermost_checked
from constrained.grammars.matcher import row_ids
from constrained.schema.json_scan import STRING, VALUE, pack

if TYPE_CHECKING:
    from constrained.grammars.checked_contains import ContainsSteering
    from constrained.grammars.checked_lookahead import TokenLookahead
    from constrained.grammars.checked_text import FollowedText
    from constrained.schema.array_checks import CheckPlan
    from constrained.schema.json_scan import TokenReach


class RowClearing:
    """One request's clearing of its rows by the array checks."""

    def __init__(
        self,
        followed: FollowedText,
        plan: CheckPlan,
        reach: TokenReach,
        lookahead: TokenLookahead,
        steering: ContainsSteering,
    ) -> None:
        self.followed = followed
        self.plan = plan
        self.reach = reach
        self.lookahead = lookahead
        self.steering = steering

    def clear(self, words: np.ndarray) -> None:
        """Clear, in a row's uint32 ``words``, the tokens that would break a check or leave
        the array no way to meet it."""
        repeats = self._string_repeats()
        refused: list[int] = []
        if repeats:  # in a uniqueItems string: the closing tokens looked up by their text
            by_prefix = self.reach.by_prefix
            refused = [
                t for text in repeats for t in by_prefix.get(text, ()) if has_token(words, t)
            ]
        candidates = self._candidates(words, quiet_known=repeats is not None)
        refused += [int(t) for t in candidates if not self.lookahead.allows(t)]
        refused += [t for t in self._replays(words) if self.followed.forced_into_break(t)]
        if refused:
            ids = np.asarray(refused)
            np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))
        self.steering.steer_into_match(words)
        self.steering.refuse_forced_matches(words)

    def _candidates(self, words: np.ndarray, quiet_known: bool = False) -> np.ndarray:
        """The allowed tokens that may complete an item or close an array (a superset);
        with ``quiet_known``, less the ``quiet_close`` ones (``_string_repeats`` judged them)."""
        scan = self.followed.scan
        inside = scan.mode == STRING
        checked = innermost_checked(scan)
        if checked is not None and scan.stack[checked].rules.finite is not None:
            return row_ids(words)  # an enum's items: few tokens, the look-ahead reads each
        depth = None if checked is None else scan.depth_in(checked)
        scalars = depth == 0 and not inside and scan.stack[checked].rules.unique
        escape = scan.escape if inside else 0
        reach = self.reach.may_complete(inside, depth, scalars, escape)[: len(words)]
        if self.plan.dead_arrays and not inside:  # a '[' may open an array no check meets
            reach = reach | _opening(self.followed.pieces)[: len(words)]
        hits = words & reach
        if quiet_known:
            hits &= ~self.reach.packed_quiet()[: len(words)]
        return row_ids(hits)

    def _replays(self, words: np.ndarray) -> list[int]:
        """Allowed tokens that keep the item being written (of the innermost ``uniqueItems``
        array) a prefix of an earlier item as written, without completing it: after one of
        them the backend may force the rest of the repeat (a closed object's ``}``, a string
        at its ``maxLength``), which the checks would then refuse with nothing left."""
        followed = self.followed
        scan = followed.scan
        index = innermost_checked(scan)
        if index is None or followed.inner.forced_bytes() is None:
            return []
        frame = scan.stack[index]
        if not frame.rules.unique or not frame.raw:
            return []
        if scan.in_item(index):
            written, leads = followed.since(frame.item_start), (b"",)
        elif scan.mode == VALUE:  # an item starts with the next token
            written, leads = b"", (b"",)
        else:  # after an item: the token may hold the ',' and the next one's start
            written, leads = b"", (b",",)
        by_bytes, found = self.reach.by_bytes, set()
        for raw in frame.raw:
            if len(raw) > len(written) and raw.startswith(written):
                rest = raw[len(written) :]
                for end in range(1, min(len(rest), MAX_PIECE)):  # a whole rest: a candidate
                    for lead in leads:
                        token = by_bytes.get(lead + rest[:end])
                        if token is not None and has_token(words, token):
                            found.add(token)
        return sorted(found)

    def _string_repeats(self) -> set[bytes] | None:
        """Inside a string item of a ``uniqueItems`` array (the only checked array open, no
        ``contains``): the texts (decoded) that, written next and closing the string, would
        repeat an earlier item. ``None`` elsewhere (every candidate is then followed)."""
        scan = self.followed.scan
        if scan.mode != STRING or scan.in_key or scan.escape:
            return None
        checked = innermost_checked(scan)
        if checked != len(scan.stack) - 1:
            return None
        frame = scan.stack[checked]
        rules = frame.rules
        if not rules.unique or rules.contains or rules.finite is not None:
            return None
        if any(f.rules is not None for f in scan.stack[:checked]):
            return None
        written = self.followed.since(scan.start + 1)
        if 0x5C in written:  # escapes: compare decoded texts the slow way
            return None
        repeats = set()
        for key in frame.seen:
            if key[0] == "s":
                seen = key[1].encode("utf-8", "surrogatepass")  # "\ud800" written escaped
                if seen.startswith(written):
                    repeats.add(seen[len(written) :])
        return repeats


def _opening(pieces: list[bytes]) -> np.ndarray:
    """Bitmask words of the tokens holding a ``[`` (built once per vocabulary)."""
    key = id(pieces)
    words = _OPENING.get(key)
    if words is None:
        words = _OPENING[key] = pack(np.array([b"[" in p for p in pieces]))
    return words


_OPENING: dict[int, np.ndarray] = {}
