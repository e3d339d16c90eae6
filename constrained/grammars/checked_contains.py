"""What an array's ``contains`` still need against the room it has: the items that match
(``checked_matcher.py``).

Inside a checked array short of ``contains`` matches, ``ContainsSteering`` finds items the
next one may be that match every ``contains`` it must (``matching_texts``: values of the item
domain or guessed from the item's subschemas, ``array_checks.sample_values``, each checked by
consuming it and rolling back; remembered per array state), and uses them:

- ``steer_into_match``: where the matches still needed fill the items left under
  ``maxItems``, a row keeps only the tokens that write a prefix of a matching item;
- ``matching_ahead``: the same judgement of a token that starts such an item;
- ``forced``: at an item's start, a matching item's tokens, for witness walks
  (``CheckedMatcher.forced``), so that they meet ``minContains`` instead of writing the
  shortest items until ``maxItems``.

``refuse_forced_matches`` clears, at a ``maxContains``, a token after which the bytes the
backend forces complete one match too many.

Example::

    steering = ContainsSteering(followed, plan, reach)
    steering.steer_into_match(words)   # a row's uint32 words, narrowed in place
    tokens = steering.forced()         # [] where no match is needed next
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.checked_text import MAX_PIECE, has_token, innermost_checked
from constrained.grammars.matcher import row_ids
from constrained.schema.array_checks import canonical, completable, sample_values
from constrained.schema.json_scan import AFTER, SCALAR, VALUE, Frame, Scan

if TYPE_CHECKING:
    from constrained.grammars.checked_text import FollowedText
    from constrained.schema.array_checks import CheckPlan
    from constrained.schema.json_scan import TokenReach

MAX_FOLLOWED = 256  # allowed tokens of a row the maxContains look-ahead follows, at most
MAX_STATES = 256  # array states whose matching items are remembered


class ContainsSteering:
    """One request's ``contains`` look-aheads and the matching items they found."""

    def __init__(self, followed: FollowedText, plan: CheckPlan, reach: TokenReach) -> None:
        self.followed = followed
        self.plan = plan
        self.reach = reach
        self._matching: dict[tuple, list[bytes]] = {}  # ``matching_texts`` by array state
        self._samples: dict[tuple, list[Any]] = {}  # candidate item values by array and index

    def needed(self, frame: Frame, forced: bool) -> tuple[int, ...]:
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

    @staticmethod
    def _state(frame: Frame, needed: tuple[int, ...]) -> tuple:
        return (id(frame.rules), frame.nodes, frame.count, frame.seen, frame.matched,
                frame.loose, needed)  # fmt: skip

    def matching_texts(self, frame: Frame, needed: tuple[int, ...], lead: bytes) -> list[bytes]:
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
            schemas = self.plan.ordered(nodes)
            contains = {id(c.schema) for c in rules.contains}
            items = [s for s in schemas if id(s) not in contains]
            found = sample_values(schemas, self.plan.schema)
            found += sample_values(items, self.plan.schema)
            if len(self._samples) >= MAX_STATES:
                self._samples.clear()
            self._samples[key] = found
        return found

    def _consumable(self, text: bytes) -> bool:
        """Whether ``text`` and then a ``,`` or a ``]`` can be consumed now (matcher and
        text unchanged)."""
        tokens = self.tokens_of(text)
        if tokens is None:
            return False
        followed = self.followed
        taken = followed.try_consume(tokens)
        try:
            if taken != len(tokens):
                return False
            for closer in (b",", b"]"):
                token = self.reach.by_bytes.get(closer)
                if token is not None and followed.try_consume([token]) == 1:
                    followed.rollback(1)
                    return True
            return False
        finally:
            followed.rollback(taken)

    def tokens_of(self, text: bytes) -> list[int] | None:
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

    def forced(self) -> list[int]:
        """Inside a checked array short of ``contains`` matches (the innermost open
        container), at an item's start (or before its ``,``): a matching item's tokens;
        in a number that already is one, the ``,`` ending it. Else ``[]``."""
        scan = self.followed.scan
        index = innermost_checked(scan)
        if index is None or index != len(scan.stack) - 1:
            return []
        frame = scan.stack[index]
        if not frame.rules.contains:
            return []
        needed = self.needed(frame, forced=True)
        if not needed:
            return []
        if scan.mode == SCALAR and not scan.literal:  # a number: end it if it matches
            return self._number_end(frame, needed)
        if scan.mode not in (VALUE, AFTER):
            return []
        lead = b"," if scan.mode == AFTER else b""
        for wanted in (needed, *((i,) for i in needed)):
            texts = self.matching_texts(frame, wanted, lead)
            if texts:
                return self.tokens_of(lead + texts[0]) or []
        return []

    def _number_end(self, frame: Frame, needed: tuple[int, ...]) -> list[int]:
        """A ``,`` after a number item that is a matching item found ahead, where more
        matches than this one are needed (the walk would otherwise write its digits on)."""
        written = self.followed.since(frame.item_start)
        texts = self._matching.get(self._state(frame, needed))
        comma = self.reach.by_bytes.get(b",")
        more = any(frame.rules.contains[i].at_least - frame.matched[i] > 1 for i in needed)
        if not (more and texts and written in texts and comma is not None):
            return []
        if self.followed.try_consume([comma]):
            self.followed.rollback(1)
            return [comma]
        return []

    def steer_into_match(self, words: np.ndarray) -> None:
        """In a checked array (items not a finite domain) whose next item must match a
        ``contains`` (the matches still needed fill the room left): allow only the tokens
        that write a prefix of a matching item found ahead (``matching_texts``), from its
        first token."""
        scan = self.followed.scan
        index = innermost_checked(scan)
        if index is None:
            return
        frame = scan.stack[index]
        if frame.rules.finite is not None or not frame.rules.contains:
            return
        needed = self.needed(frame, forced=False)
        if not needed:
            return
        top = index == len(scan.stack) - 1
        if scan.in_item(index):
            written, lead = self.followed.since(frame.item_start), b""
            texts = self._matching.get(self._state(frame, needed))
        elif top and scan.mode in (VALUE, AFTER):
            written, lead = b"", b"," if scan.mode == AFTER else b""
            texts = self.matching_texts(frame, needed, lead)
        else:
            return
        if not texts:
            return  # none found: the checks refuse a non-matching item when it completes
        allowed = self._prefix_tokens(texts, written, lead)
        kept = np.zeros_like(words)
        for token in allowed:
            if has_token(words, token):
                kept[token >> 5] |= np.uint32(1 << (token & 31))
        words[:] = kept

    def _prefix_tokens(self, texts: list[bytes], written: bytes, lead: bytes) -> set[int]:
        """The tokens that write on (after ``lead``) from ``written`` a prefix of one of
        ``texts``; where one is complete, the tokens that may end it."""
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
        return allowed

    def matching_ahead(self, trial: Scan, index: int, piece: bytes) -> bool:
        """A token that starts an item (after completing the one before, or opening the
        array) that must match a ``contains``: allowed only as a prefix of a matching item
        found ahead (consumed after the token's bytes before it)."""
        frame = trial.stack[index]
        rules = frame.rules
        if rules.finite is not None or not rules.contains or not trial.in_item(index):
            return True
        base = len(self.followed.text)
        if frame.item_start < base:
            return True  # the item started earlier: ``steer_into_match`` judged it
        needed = self.needed(frame, forced=False)
        if not needed:
            return True
        lead = piece[: frame.item_start - base]  # what the token writes before it
        texts = self.matching_texts(frame, needed, lead)
        written = self.followed.item_text(frame.item_start, piece)
        return any(text.startswith(written) for text in texts)

    def refuse_forced_matches(self, words: np.ndarray) -> None:
        """Inside an item of a checked array (items not a finite domain) at a
        ``maxContains``: refuse a token after which the bytes the backend forces complete
        a match one too many (an ``enum`` member's rest, a ``const``), where the row holds
        few tokens (where it holds many, a forced completion is not near)."""
        followed = self.followed
        scan = followed.scan
        index = innermost_checked(scan)
        if index is None or not scan.in_item(index):
            return
        frame = scan.stack[index]
        rules = frame.rules
        if rules.finite is not None or not rules.contains:
            return
        pairs = zip(rules.contains, frame.loose, strict=True)
        full = any(c.at_most is not None and n >= c.at_most for c, n in pairs)
        if not full and not self.needed(frame, forced=False):
            return
        ids = row_ids(words)
        if len(ids) > MAX_FOLLOWED or followed.inner.forced_bytes() is None:
            return
        for token in ids.tolist():
            if token != followed.eos and followed.forced_into_break(token):
                words[token >> 5] &= ~np.uint32(1 << (token & 31))
