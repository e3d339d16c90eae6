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
  llguidance, a token after which the bytes the grammar forces complete a repeat (or a
  match past ``maxContains``).

No dead ends, by construction: what an array still needs is counted against the room it
has. Over a finite item domain, a value is allowed only if the array can still be completed
after it (``CheckPlan.values_left``: unused values, matches still needed for ``minContains``
and items for ``minItems`` within ``maxItems``, none past ``maxContains``). Otherwise, when
the items left under ``maxItems`` equal the matches still needed, the next item must match:
from its first token only prefixes of matching items found ahead are allowed (values guessed
from the item's subschemas, ``sample_values``, each checked by consuming it and rolling
back), and an item that completes without matching is refused. Checks no array can meet are
refused when the grammar is compiled (``array_checks``); where the subschema allows other
values, the ``[`` that would open such an array is refused.

Cost, per step of a row inside a checked array (measured 60-150 µs on the 2-core CPU,
``benchmarks/array_checks.py``): the row's words ANDed with the tokens that can complete an
item or close or open an array there (``json_scan.TokenReach``), then each of those tokens
followed in Python (over a finite domain, every allowed token). Rows outside checked
arrays pay the AND for a ``[`` / ``]`` (an array opened or closed within one token).

If a row is left with no token anyway, that is a bug: the row the layers below wrote is
kept (the output still parses, though a check may break), ``stuck`` is set and an error
logged; end-of-sequence alone is never written for it (a ``stop`` is a complete, valid
output). ``forced`` steers witness walks (``closing.find_witness``) into ``contains``
matches. Look-aheads (a witness walk, a draft row) leave no trace once rolled back.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.matcher import (
    Matcher,
    MatcherWrapper,
    fill_only,
    row_ids,
    words_for,
)
from constrained.schema.array_checks import (
    CheckPlan,
    canonical,
    canonical_text,
    completable,
    plan_checks,
    sample_values,
)
from constrained.schema.json_scan import (
    AFTER,
    ARRAY,
    SCALAR,
    STRING,
    VALUE,
    Frame,
    Scan,
    TokenReach,
    feed,
    pack,
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
MAX_FOLLOWED = 256  # allowed tokens of a row the maxContains look-ahead follows, at most
MAX_STATES = 256  # array states whose matching items are remembered


def reach_of(vocab: Vocab) -> TokenReach:
    """The vocabulary's ``TokenReach``, built once."""
    return vocab._once("json_reach", lambda: token_reach(vocab.token_bytes()))


class CheckedGrammar:
    """A backend's compiled grammar (``inner``) and the checks its schema lost (``plan``)."""

    #: A row depends on the items seen (``uniqueItems``, ``contains``), not only on the
    #: grammar's state: requests do not share closing's checks (``backend.CompiledGrammar``).
    history = True

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
            if not completable(frame.count + 1, rules, tuple(strict), tuple(loose)):
                return False  # the matches still needed no longer fit in maxItems
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


class CheckedMatcher(MatcherWrapper):
    """One request: the backend's matcher, the JSON text so far and the checks' state."""

    def __init__(self, inner: Matcher, plan: CheckPlan, vocab: Vocab) -> None:
        super().__init__(inner)
        self.plan = plan
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
        self._matching: dict[tuple, list[bytes]] = {}  # ``_matching_texts`` by array state
        self._samples: dict[tuple, list[Any]] = {}  # candidate item values by array and index
        #: Set when the checks left a row no token (a bug: the look-aheads should keep every
        #: row open); the backend's own row was written instead, and an error logged.
        self.stuck = False

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
            self.error = self.inner.error or "token refused"
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

    def forced(self) -> list[int]:
        """The backend's forced tokens; inside a checked array that still needs ``contains``
        matches, at an item's start, the tokens of an item that matches (consumable: checked
        when found). ``closing.find_witness`` takes them first, so a witness walk meets
        ``minContains`` instead of writing the shortest items until ``maxItems``; a model is
        never made to write them (the masks allow every item that keeps the array
        completable)."""
        if self.error is not None:
            return []
        steering = self._steering()
        if steering:
            return steering
        return self.inner.forced()

    def forced_bytes(self) -> bytes | None:
        return self.inner.forced_bytes() if self.error is None else b""

    # -- masks ---------------------------------------------------------------------------

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        self.inner.fill(bitmask, row)  # the layers below, their own clearing included
        self._narrow_own(bitmask, row)

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear, in a row the layers below wrote, the tokens that would break a check or
        leave the array no way to meet it."""
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        words = bitmask[row].numpy().view(np.uint32)
        backend_row = words.copy()
        repeats = self._string_repeats()
        refused: list[int] = []
        if repeats:  # in a uniqueItems string: the closing tokens looked up by their text
            by_prefix = self.reach.by_prefix
            refused = [t for text in repeats for t in by_prefix.get(text, ()) if _has(words, t)]
        candidates = self._candidates(words, quiet_known=repeats is not None)
        refused += [int(t) for t in candidates if not self._allows(t)]
        refused += [t for t in self._replays(words) if self._forced_into_break(t)]
        if refused:
            ids = np.asarray(refused)
            np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))
        self._steer_into_match(words)
        self._refuse_forced_matches(words)
        if not words.any():  # a bug: the look-aheads let the array reach a dead end
            words[:] = backend_row  # the output still parses; a check may break
            self.stuck = True
            logger.error(
                "constrained: %s after %r; writing the backend's row without the array checks",
                STUCK,
                bytes(self.text[-64:]),
            )

    def _candidates(self, words: np.ndarray, quiet_known: bool = False) -> np.ndarray:
        """The allowed tokens that may complete an item or close an array (a superset);
        with ``quiet_known``, less the ``quiet_close`` ones (``_string_repeats`` judged them)."""
        scan = self.scan
        inside = scan.mode == STRING
        checked = _innermost_checked(scan)
        if checked is not None and scan.stack[checked].rules.finite is not None:
            return row_ids(words)  # an enum's items: few tokens, the look-ahead reads each
        depth = None if checked is None else scan.depth_in(checked)
        scalars = depth == 0 and not inside and scan.stack[checked].rules.unique
        escape = scan.escape if inside else 0
        reach = self.reach.may_complete(inside, depth, scalars, escape)[: len(words)]
        if self.plan.dead_arrays and not inside:  # a '[' may open an array no check meets
            reach = reach | _opening(self.pieces)[: len(words)]
        hits = words & reach
        if quiet_known:
            hits &= ~self.reach.packed_quiet()[: len(words)]
        return row_ids(hits)

    def _replays(self, words: np.ndarray) -> list[int]:
        """Allowed tokens that keep the item being written (of the innermost ``uniqueItems``
        array) a prefix of an earlier item as written, without completing it: after one of
        them the backend may force the rest of the repeat (a closed object's ``}``, a string
        at its ``maxLength``), which the checks would then refuse with nothing left."""
        scan = self.scan
        index = _innermost_checked(scan)
        if index is None or self.inner.forced_bytes() is None:
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

    def _forced_into_break(self, token: int) -> bool:
        """After ``token``, the bytes the backend forces (llguidance names them) break a
        check."""
        if self.inner.try_consume([token]) != 1:
            return False
        try:
            forced = (self.inner.forced_bytes() or b"")[:MAX_FORCED]
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
        if self.plan.dead_arrays and any(
            f.rules is not None and not self.plan.satisfiable(f.rules) for f in trial.stack
        ):
            return False  # it opens an array no items can make meet its checks
        index = _innermost_checked(trial)  # the array the look-aheads are about
        if index is None:
            return True
        return (
            self._matching_ahead(trial, index, piece)
            and self._unused_value_ahead(trial, index, piece)
            and self._number_goes_on(trial, index, token)
            and not (self._replaying(trial, index, piece) and self._forced_into_break(token))
        )

    def _replaying(self, trial: Scan, index: int, piece: bytes) -> bool:
        """After ``piece``, the item being written (of the innermost ``uniqueItems`` array)
        is a proper prefix of an earlier item as written (``_replays``' test, for a token
        that also completed something, as ``","+`` after ``["+`` does)."""
        frame = trial.stack[index]
        if not frame.rules.unique or not frame.raw or not trial.in_item(index):
            return False
        written = self._item_text(frame.item_start, piece)
        if not any(len(raw) > len(written) and raw.startswith(written) for raw in frame.raw):
            return False
        return self.inner.forced_bytes() is not None

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
        """The values (JSON bytes, sorted) of a finite item domain the next item may take
        and the array still be completed (``CheckPlan.values_left``)."""
        memo = (id(frame.rules), frame.count, frame.seen, frame.matched, frame.loose)
        left = self._left.get(memo)
        if left is None:
            left = self.plan.values_left(
                frame.rules, frame.count, frame.seen, frame.matched, frame.loose
            )
            if len(self._left) >= 64:  # states of the last steps only
                self._left.clear()
            self._left[memo] = left
        return left

    # -- contains: what an array still needs against its room ---------------------------

    def _needed(self, frame: Frame, forced: bool) -> tuple[int, ...]:
        """The ``contains`` (indexes) the next item of ``frame`` must match: those whose
        matches still needed fill the items left under ``maxItems``; with ``forced``, every
        one still short of its ``minContains``."""
        rules = frame.rules
        high = rules.max_items
        left = None if high is None or frame.count >= high else high - frame.count
        needed = []
        for i, (contains, n) in enumerate(zip(rules.contains, frame.matched, strict=True)):
            need = contains.at_least - n
            if need > 0 and (forced or (left is not None and need >= left)):
                needed.append(i)
        return tuple(needed)

    def _state(self, frame: Frame, needed: tuple[int, ...]) -> tuple:
        return (id(frame.rules), frame.nodes, frame.count, frame.seen, frame.matched,
                frame.loose, needed)  # fmt: skip

    def _matching_texts(self, frame: Frame, needed: tuple[int, ...], lead: bytes) -> list[bytes]:
        """Items (compact JSON) the next item of ``frame`` may be that match every
        ``contains`` in ``needed`` and keep the array completable, each checked by
        consuming it (after ``lead``, at the item's start) then a ``,`` or ``]``. Found from
        the item domain or values guessed from the item's subschemas (``sample_values``);
        remembered per array state."""
        key = self._state(frame, needed)
        texts = self._matching.get(key)
        if texts is not None:
            return texts
        rules, plan = frame.rules, self.plan
        texts = []
        for value in self._item_samples(frame):
            strict, looser = plan.signature(rules, value)
            if not all(strict[i] for i in needed):
                continue
            if rules.unique and canonical(value) in frame.seen:
                continue
            matched = tuple(m + x for m, x in zip(frame.matched, strict, strict=True))
            loose = tuple(m + x for m, x in zip(frame.loose, looser, strict=True))
            if not completable(frame.count + 1, rules, matched, loose):
                continue
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
            if self._consumable(lead + text):
                texts.append(text)
        if len(self._matching) >= MAX_STATES:
            self._matching.clear()
        self._matching[key] = texts
        return texts

    def _item_samples(self, frame: Frame) -> list[Any]:
        """Candidate values of the next item of ``frame``."""
        rules = frame.rules
        if rules.finite is not None:
            return [json.loads(text) for _, text in rules.finite]
        nodes = self.plan.child(frame.nodes, frame.count)
        key = (id(rules), nodes)
        found = self._samples.get(key)
        if found is None:
            schemas = [self.plan.nodes[n] for n in nodes]
            contains = {id(c.schema) for c in rules.contains}
            items = [s for s in schemas if id(s) not in contains]
            found = sample_values(schemas, self.plan.schema)
            found += sample_values(items, self.plan.schema)
            if len(self._samples) >= MAX_STATES:
                self._samples.clear()
            self._samples[key] = found
        return found

    def _consumable(self, text: bytes) -> bool:
        """Whether ``text`` and then a ``,`` or a ``]`` can be consumed now (matcher
        unchanged)."""
        tokens = self._tokens_of(text)
        if tokens is None:
            return False
        taken = self.try_consume(tokens)
        try:
            if taken != len(tokens):
                return False
            for closer in (b",", b"]"):
                token = self.reach.by_bytes.get(closer)
                if token is not None and self.try_consume([token]) == 1:
                    self.rollback(1)
                    return True
            return False
        finally:
            self.rollback(taken)

    def _tokens_of(self, text: bytes) -> list[int] | None:
        """Tokens writing ``text``, longest first (``None`` if a byte has no token)."""
        by_bytes, tokens, at = self.reach.by_bytes, [], 0
        while at < len(text):
            for end in range(min(len(text), at + MAX_PIECE), at, -1):
                token = by_bytes.get(text[at:end])
                if token is not None:
                    tokens.append(token)
                    at = end
                    break
            else:
                return None
        return tokens

    def _steering(self) -> list[int]:
        """``forced``'s tokens inside a checked array short of ``contains`` matches: at an
        item's start (or before its ``,``), a matching item's."""
        scan = self.scan
        index = _innermost_checked(scan)
        if index is None or index != len(scan.stack) - 1:
            return []
        frame = scan.stack[index]
        if not frame.rules.contains:
            return []
        needed = self._needed(frame, forced=True)
        if not needed:
            return []
        if scan.mode == SCALAR and not scan.literal:  # a number: end it if it matches
            written = bytes(self.text[frame.item_start :])
            texts = self._matching.get(self._state(frame, needed))
            comma = self.reach.by_bytes.get(b",")
            more = any(frame.rules.contains[i].at_least - frame.matched[i] > 1 for i in needed)
            if not (more and texts and written in texts and comma is not None):
                return []
            if self.try_consume([comma]):
                self.rollback(1)
                return [comma]
            return []
        if scan.mode not in (VALUE, AFTER):
            return []
        lead = b"," if scan.mode == AFTER else b""
        for wanted in (needed, *((i,) for i in needed)):
            texts = self._matching_texts(frame, wanted, lead)
            if texts:
                return self._tokens_of(lead + texts[0]) or []
        return []

    def _steer_into_match(self, words: np.ndarray) -> None:
        """In a checked array (items not a finite domain) whose next item must match a
        ``contains`` (the matches still needed fill the room left): allow only the tokens
        that write a prefix of a matching item found ahead (``_matching_texts``), from its
        first token."""
        scan = self.scan
        index = _innermost_checked(scan)
        if index is None:
            return
        frame = scan.stack[index]
        if frame.rules.finite is not None or not frame.rules.contains:
            return
        needed = self._needed(frame, forced=False)
        if not needed:
            return
        top = index == len(scan.stack) - 1
        if scan.in_item(index):
            written, lead = bytes(self.text[frame.item_start :]), b""
            texts = self._matching.get(self._state(frame, needed))
        elif top and scan.mode in (VALUE, AFTER):
            written, lead = b"", b"," if scan.mode == AFTER else b""
            texts = self._matching_texts(frame, needed, lead)
        else:
            return
        if not texts:
            return  # none found: the checks refuse a non-matching item when it completes
        allowed: set[int] = set()
        by_bytes = self.reach.by_bytes
        for text in texts:
            if not text.startswith(written):
                continue
            if len(text) == len(written):  # complete, but a number may go on: its end
                allowed.update(by_bytes[c] for c in (b",", b"]", b"}") if c in by_bytes)
                continue
            rest = lead + text[len(written) :]
            for end in range(1, min(len(rest), MAX_PIECE) + 1):
                token = by_bytes.get(rest[:end])
                if token is not None:
                    allowed.add(token)
        kept = np.zeros_like(words)
        for token in allowed:
            if _has(words, token):
                kept[token >> 5] |= np.uint32(1 << (token & 31))
        words[:] = kept

    def _matching_ahead(self, trial: Scan, index: int, piece: bytes) -> bool:
        """A token that starts an item (after completing the one before, or opening the
        array) that must match a ``contains``: allowed only as a prefix of a matching item
        found ahead (consumed after the token's bytes before it)."""
        frame = trial.stack[index]
        rules = frame.rules
        if rules.finite is not None or not rules.contains or not trial.in_item(index):
            return True
        if frame.item_start < len(self.text):
            return True  # the item started earlier: ``_steer_into_match`` judged it
        needed = self._needed(frame, forced=False)
        if not needed:
            return True
        lead = piece[: frame.item_start - len(self.text)]  # what the token writes before it
        texts = self._matching_texts(frame, needed, lead)
        written = self._item_text(frame.item_start, piece)
        return any(text.startswith(written) for text in texts)

    def _refuse_forced_matches(self, words: np.ndarray) -> None:
        """Inside an item of a checked array (items not a finite domain) at a
        ``maxContains``: refuse a token after which the bytes the backend forces complete
        a match one too many (an ``enum`` member's rest, a ``const``), where the row holds
        few tokens (where it holds many, a forced completion is not near)."""
        scan = self.scan
        index = _innermost_checked(scan)
        if index is None or not scan.in_item(index):
            return
        frame = scan.stack[index]
        rules = frame.rules
        if rules.finite is not None or not rules.contains:
            return
        pairs = zip(rules.contains, frame.loose, strict=True)
        full = any(c.at_most is not None and n >= c.at_most for c, n in pairs)
        if not full and not self._needed(frame, forced=False):
            return
        ids = row_ids(words)
        if len(ids) > MAX_FOLLOWED or self.inner.forced_bytes() is None:
            return
        for token in ids.tolist():
            if token != self.eos and self._forced_into_break(token):
                words[token >> 5] &= ~np.uint32(1 << (token & 31))

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


def _opening(pieces: list[bytes]) -> np.ndarray:
    """Bitmask words of the tokens holding a ``[`` (built once per vocabulary)."""
    key = id(pieces)
    words = _OPENING.get(key)
    if words is None:
        words = _OPENING[key] = pack(np.array([b"[" in p for p in pieces]))
    return words


_OPENING: dict[int, np.ndarray] = {}


def _has(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def _innermost_checked(scan: Scan) -> int | None:
    for index in range(len(scan.stack) - 1, -1, -1):
        if scan.stack[index].rules is not None:
            return index
    return None
