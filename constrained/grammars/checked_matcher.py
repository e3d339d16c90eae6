"""A backend's matcher plus the array checks it cannot do: ``uniqueItems`` and ``contains``.

``CheckedGrammar`` wraps the grammar a backend compiled from the schema without those keywords
(``array_checks.plan_checks``); each ``CheckedMatcher`` follows its request's JSON text
(``json_scan``) and, after the backend fills a mask, clears the tokens that would break a
check:

- a token completing an item equal to an earlier item of a ``uniqueItems`` array;
- a token completing an item that would be one match too many for a ``maxContains``;
- a token closing an array with fewer ``contains`` matches than it needs (``minContains``,
  1 by default);
- look-aheads, so that breaking a check is not the only way on: over a finite item domain
  (an ``enum`` of plain scalars, bounded integers ...) a token leaving an item no value
  still allowed starts with, or a ``,`` when none is left; a literal repeating an item, at
  its first letter; a number repeating one where the backend lets it go no further; with
  llguidance, a token after which the bytes the grammar forces complete a repeat.

Cost, per step of a row inside a checked array (measured 60-150 µs on the 2-core CPU,
``benchmarks/array_checks.py``): the row's words ANDed with the tokens that can complete an
item or close or open an array there (``json_scan.TokenReach``), then each of those tokens
followed in Python (over a finite domain, every allowed token). Rows outside checked
arrays pay the AND for a ``[`` / ``]`` (an array opened or closed within one token).

Where the checks leave a row no token at all (an ``enum`` whose values are used up where
``minItems`` asks for more, ``contains`` that nothing within ``maxItems`` can still meet),
only end-of-sequence is allowed; taking it ends the request with ``error`` set and a
warning, its output incomplete rather than invalid. A fill ahead (a witness walk, a draft
row) that meets such a row leaves no trace once rolled back.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.matcher import Matcher, fill_only, words_for
from constrained.schema.array_checks import CheckPlan, canonical, canonical_text, plan_checks
from constrained.schema.json_scan import (
    ARRAY,
    SCALAR,
    STRING,
    VALUE,
    Frame,
    Scan,
    TokenReach,
    feed,
    token_reach,
)

if TYPE_CHECKING:
    import torch

    from constrained.grammars.backend import CompiledGrammar
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)
STUCK = "no token keeps uniqueItems / contains (a dead end)"
MAX_PIECE = 32  # bytes of a token the replay look-ahead tries
MAX_FORCED = 256  # forced bytes it follows


def reach_of(vocab: Vocab) -> TokenReach:
    """The vocabulary's ``TokenReach``, built once."""
    return vocab._once("json_reach", lambda: token_reach(vocab.token_bytes()))


class CheckedGrammar:
    """A backend's compiled grammar (``inner``) and the checks its schema lost (``plan``)."""

    def __init__(self, inner: CompiledGrammar, plan: CheckPlan, vocab: Vocab) -> None:
        self.inner = inner
        self.plan = plan
        self.vocab = vocab
        self.backend = inner.backend
        reach_of(vocab)  # built here, in a compile thread, not in the first mask fill

    def matcher(self) -> CheckedMatcher:
        return CheckedMatcher(self.inner.matcher(), self.plan, self.vocab)


def unwrapped(grammar: Any) -> Any:
    """The backend's own grammar (what the store keeps)."""
    return grammar.inner if isinstance(grammar, CheckedGrammar) else grammar


def with_checks(spec: GrammarSpec, grammar: Any, vocab: Vocab) -> Any:
    """``grammar`` (a backend's, loaded from the store) with the checks ``spec`` asks for, as
    ``auto.compile_with`` built it."""
    if spec.kind != "json_schema":
        return grammar
    planned = plan_checks(spec.source, grammar.backend)
    return grammar if planned is None else CheckedGrammar(grammar, planned[1], vocab)


class _Checks:
    """``json_scan.Events`` enforcing a ``CheckPlan``."""

    def __init__(self, plan: CheckPlan) -> None:
        self.plan = plan
        self._matches: dict[tuple[int, Any, bool], bool] = {}

    def opened(self, frame: Frame, parent: Frame | None) -> None:
        plan = self.plan
        if parent is None:
            frame.nodes = plan.root
        else:
            at = parent.count if parent.kind == ARRAY else parent.key
            frame.nodes = plan.child(parent.nodes, at if at is not None else "")
        if frame.kind == ARRAY:
            frame.rules = plan.rules(frame.nodes)
            if frame.rules is not None:
                frame.matched = frame.loose = (0,) * len(frame.rules.contains)

    def item(self, frame: Frame, text: bytes) -> bool:
        rules = frame.rules
        key = canonical_text(text)
        if rules.unique:
            if key in frame.seen:
                return False
            frame.seen, frame.raw = frame.seen | {key}, (*frame.raw, text)
        if rules.contains:
            strict, loose = list(frame.matched), list(frame.loose)
            for i, contains in enumerate(rules.contains):
                if self.match(contains, key, text, strict=False):
                    loose[i] += 1
                    if contains.at_most is not None and loose[i] > contains.at_most:
                        return False
                    strict[i] += self.match(contains, key, text, strict=True)
            frame.matched, frame.loose = tuple(strict), tuple(loose)
        return True

    def match(self, contains: Any, key: Any, text: bytes, strict: bool) -> bool:
        """Whether the item ``text`` (canonical ``key``) counts for ``contains``: ``strict``
        for ``minContains``, loose for ``maxContains`` (``CheckPlan.matches``; memoized)."""
        memo = (id(contains), key, strict)
        found = self._matches.get(memo)
        if found is None:
            if len(self._matches) >= 4096:
                self._matches.clear()
            found = self.plan.matches(contains, json.loads(text), strict)
            self._matches[memo] = found
        return found

    def closed(self, frame: Frame) -> bool:
        pairs = zip(frame.matched, frame.rules.contains, strict=True)
        return all(n >= contains.at_least for n, contains in pairs)


class CheckedMatcher:
    """One request: the backend's matcher, the JSON text so far and the checks' state."""

    def __init__(self, inner: Matcher, plan: CheckPlan, vocab: Vocab) -> None:
        self.inner = inner
        self.pieces = vocab.token_bytes()
        self.width = vocab.width
        self.eos = vocab.eos_token_id
        self.reach = reach_of(vocab)
        self.events = _Checks(plan)
        self.scan = Scan()
        self.text = bytearray()
        self.history: list[tuple[Scan, int]] = []  # the state before each consumed token
        self.scratch: torch.Tensor | None = None  # a mask row for the number look-ahead
        self._words: np.ndarray | None = None  # its memory
        self._left: dict[tuple, list[bytes]] = {}  # ``_values_left`` by array state
        self._stuck = -1  # the position (tokens) where a row was left with nothing
        self.error: str | None = inner.error

    # -- following the text ------------------------------------------------------------

    def _advance(self, token: int) -> bool:
        """Follow one token (already allowed by the backend); False if it breaks a check,
        with the state left as before it."""
        self.history.append((self.scan.copy(), len(self.text)))
        piece = self.pieces[token] if token != self.eos else b""
        if feed(self.scan, piece, len(self.text), self.text, self.events):
            self.text += piece
            return True
        self.scan, _ = self.history.pop()
        return False

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        if not self.inner.consume(tokens):
            self.error = self.inner.error
            if self._stuck == len(self.history):  # the end-of-sequence a dead end allowed
                self.error = STUCK
                logger.warning("constrained: %s; the request ends", STUCK)
            return False
        for token in tokens:
            if self.error is None and not self._advance(token):
                self.error = "a token broke uniqueItems / contains"
            if self.error is not None:  # one history entry per token the backend took
                self.history.append((self.scan.copy(), len(self.text)))
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        if self.error is not None:
            return 0
        tokens = list(tokens)
        accepted = self.inner.try_consume(tokens)
        for i in range(accepted):
            if not self._advance(tokens[i]):
                self.inner.rollback(accepted - i)
                return i
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        self.inner.rollback(num_tokens)
        self.scan, length = self.history[-num_tokens]
        del self.history[-num_tokens:]
        del self.text[length:]

    def accepts_end(self) -> bool:
        return self.error is None and self.inner.accepts_end()

    def forced(self) -> list[int]:
        """The backend's forced tokens, where it names them (``closing.find_witness``
        consumes them with ``try_consume``, which checks them)."""
        forced = getattr(self.inner, "forced", None)
        return forced() if forced is not None and self.error is None else []

    # -- masks ---------------------------------------------------------------------------

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        self.inner.fill(bitmask, row)
        self.narrow(bitmask, row)

    def narrow(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear, in a row the backend filled, the tokens that would break a check."""
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        words = bitmask[row].numpy().view(np.uint32)
        repeats = self._string_repeats()
        refused: list[int] = []
        if repeats:  # in a uniqueItems string: the closing tokens looked up by their text
            by_prefix = self.reach.by_prefix
            refused = [t for text in repeats for t in by_prefix.get(text, ()) if _has(words, t)]
        candidates = self._candidates(words, quiet_known=repeats is not None)
        refused += [int(t) for t in candidates if not self._allows(t)]
        refused += [t for t in self._replays(words) if self._forced_into_repeat(t)]
        if not refused:
            return
        ids = np.asarray(refused)
        np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))
        if not words.any():  # a dead end: only end-of-sequence, which ends the request
            # (no error here: a look-ahead fill, e.g. closing's witness walk, is undone)
            self._stuck = len(self.history)
            fill_only(bitmask, row, [self.eos])

    def _candidates(self, words: np.ndarray, quiet_known: bool = False) -> np.ndarray:
        """The allowed tokens that may complete an item or close an array (a superset);
        with ``quiet_known``, less the ``quiet_close`` ones (``_string_repeats`` judged them)."""
        scan = self.scan
        inside = scan.mode == STRING
        checked = _innermost_checked(scan)
        if checked is not None and scan.stack[checked].rules.finite is not None:
            return _ids(words)  # an enum's items: few tokens, the look-ahead reads each
        depth = None if checked is None else scan.depth_in(checked)
        scalars = depth == 0 and not inside and scan.stack[checked].rules.unique
        escape = scan.escape if inside else 0
        hits = words & self.reach.may_complete(inside, depth, scalars, escape)[: len(words)]
        if quiet_known:
            hits &= ~self.reach.packed_quiet()[: len(words)]
        return _ids(hits)

    def _replays(self, words: np.ndarray) -> list[int]:
        """Allowed tokens that keep the item being written (of the innermost ``uniqueItems``
        array) a prefix of an earlier item as written, without completing it: after one of
        them the backend may force the rest of the repeat (a closed object's ``}``, a string
        at its ``maxLength``), which the checks would then refuse with nothing left."""
        scan = self.scan
        index = _innermost_checked(scan)
        if index is None or getattr(self.inner, "forced_bytes", None) is None:
            return []
        frame = scan.stack[index]
        if not frame.rules.unique or not frame.raw:
            return []
        if scan.in_item(index):
            written, leads = bytes(self.text[frame.item_start :]), (b"",)
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
                        if token is not None and _has(words, token):
                            found.add(token)
        return sorted(found)

    def _forced_into_repeat(self, token: int) -> bool:
        """After ``token``, the bytes the backend forces (llguidance names them) break a
        check."""
        if self.inner.try_consume([token]) != 1:
            return False
        try:
            forced = self.inner.forced_bytes()[:MAX_FORCED]
        finally:
            self.inner.rollback(1)
        trial = self.scan.copy()
        written = self.pieces[token] + forced
        return not feed(trial, written, len(self.text), self.text, self.events)

    def _string_repeats(self) -> set[bytes] | None:
        """Inside a string item of a ``uniqueItems`` array (the only checked array open, no
        ``contains``): the texts (decoded) that, written next and closing the string, would
        repeat an earlier item. ``None`` elsewhere (every candidate is then followed)."""
        scan = self.scan
        if scan.mode != STRING or scan.in_key or scan.escape:
            return None
        checked = _innermost_checked(scan)
        if checked != len(scan.stack) - 1:
            return None
        frame = scan.stack[checked]
        rules = frame.rules
        if not rules.unique or rules.contains or rules.finite is not None:
            return None
        if any(f.rules is not None for f in scan.stack[:checked]):
            return None
        written = bytes(self.text[scan.start + 1 :])
        if 0x5C in written:  # escapes: compare decoded texts the slow way
            return None
        repeats = set()
        for key in frame.seen:
            if key[0] == "s":
                seen = key[1].encode("utf-8", "surrogatepass")  # "\ud800" written escaped
                if seen.startswith(written):
                    repeats.add(seen[len(written) :])
        return repeats

    def _allows(self, token: int) -> bool:
        """Whether ``token`` keeps every check (and, over a finite ``enum``, an unused value
        reachable)."""
        trial = self.scan.copy()
        piece = self.pieces[token]
        if not feed(trial, piece, len(self.text), self.text, self.events):
            return False
        index = _innermost_checked(trial)  # the array the look-aheads are about
        if index is None:
            return True
        return (
            self._unused_value_ahead(trial, index, piece)
            and self._number_goes_on(trial, index, token)
            and not (self._replaying(trial, index, piece) and self._forced_into_repeat(token))
        )

    def _replaying(self, trial: Scan, index: int, piece: bytes) -> bool:
        """After ``piece``, the item being written (of the innermost ``uniqueItems`` array)
        is a proper prefix of an earlier item as written (``_replays``' test, for a token
        that also completed something, as ``","+`` after ``["+`` does)."""
        if getattr(self.inner, "forced_bytes", None) is None:
            return False
        frame = trial.stack[index]
        if not frame.rules.unique or not frame.raw or not trial.in_item(index):
            return False
        written = self._item_text(frame.item_start, piece)
        return any(len(raw) > len(written) and raw.startswith(written) for raw in frame.raw)

    def _unused_value_ahead(self, trial: Scan, index: int, piece: bytes) -> bool:
        frame = trial.stack[index]
        finite = frame.rules.finite
        if finite is None:
            return True
        left = self._values_left(frame)
        if trial.in_item(index):
            written = self._item_text(frame.item_start, piece)
            at = bisect.bisect_left(left, written)  # sorted: the values it starts, from here
            return at < len(left) and left[at].startswith(written)
        if index == len(trial.stack) - 1 and trial.mode == VALUE and frame.count:
            return bool(left)  # after a ',': an item must come
        return True

    def _values_left(self, frame: Frame) -> list[bytes]:
        """The values (JSON bytes, sorted) of a finite item domain the next item may still
        take: not used yet (``uniqueItems``), not one match too many (``maxContains``)."""
        memo = (id(frame.rules), frame.seen, frame.loose)
        left = self._left.get(memo)
        if left is None:
            rules = frame.rules
            full = [c for c, n in zip(rules.contains, frame.loose, strict=True)
                    if c.at_most is not None and n >= c.at_most]  # fmt: skip
            left = sorted(
                text
                for key, text in rules.finite
                if not (rules.unique and key in frame.seen)
                and not any(self.events.match(c, key, text, strict=False) for c in full)
            )
            if len(self._left) >= 64:  # states of the last steps only
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
        written = self._item_text(frame.item_start, self.pieces[token])
        if trial.literal:  # true / false / null: decided by their first letter
            return canonical_text(_LITERAL_OF[written[0]]) not in frame.seen
        try:
            value = json.loads(written)
        except ValueError:  # not a number yet ("-", "1e", "0e+")
            value = None
        lower = written.lower()
        if b"e" in lower:  # in the exponent, 0 and infinity stay what they are
            head = lower.split(b"e")[0]
            if head.strip(b"-").strip(b"0.") == b"":  # a zero mantissa: 0 whatever comes
                value = 0
            if value is not None and (value == 0 or math.isinf(value)):
                return canonical(value) not in frame.seen
        if value is None or canonical(value) not in frame.seen:
            return True
        if self.inner.try_consume([token]) != 1:
            return True
        try:
            words = self._scratch_words()
            self.inner.fill(self.scratch, 0)
            return bool((words.view(np.uint32) & self.reach.next_in_number()[: len(words)]).any())
        finally:
            self.inner.rollback(1)

    def _item_text(self, start: int, piece: bytes) -> bytes:
        """The text of the item starting at ``start`` after ``piece`` is written."""
        base = len(self.text)
        return piece[start - base :] if start >= base else bytes(self.text[start:]) + piece

    def _scratch_words(self) -> np.ndarray:
        """A one-row host bitmask (``self.scratch``) and its words, read through numpy (a
        host buffer: no device involved)."""
        if self.scratch is None:
            import torch

            self._words = np.zeros((1, words_for(self.width)), np.int32)
            self.scratch = torch.from_numpy(self._words)
        return self._words[0]


_LITERAL_OF = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}


def _has(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def _ids(words: np.ndarray) -> np.ndarray:
    """The token ids whose bits are set in ``words``."""
    if not words.any():
        return np.zeros(0, np.int64)
    hit = np.flatnonzero(words)
    if not hit.size:
        return hit
    bits = np.unpackbits(words[hit].view(np.uint8), bitorder="little").reshape(-1, 32)
    return (hit[:, None] * 32 + np.arange(32))[bits.astype(bool)]


def _innermost_checked(scan: Scan) -> int | None:
    for index in range(len(scan.stack) - 1, -1, -1):
        if scan.stack[index].rules is not None:
            return index
    return None
