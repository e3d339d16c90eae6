"""The JSON text a checked request writes, followed in step with its backend matcher
(``checked_matcher.py``): the state every array check and look-ahead reads.

``FollowedText`` keeps the backend's matcher (``inner``), the output's bytes, their
``json_scan.Scan`` (which arrays are open, where the current item started) and the state
before each token, so a rollback undoes both sides. Its ``ItemChecks`` are the
``json_scan.Events`` holding the text to a ``CheckPlan``: an item repeating one of a
``uniqueItems`` array, one match past ``maxContains``, or an array closed short of its
``minContains`` stops the feed, and the token is refused. ``trial`` feeds a copy of the scan
(a look-ahead): nothing of it stays.

Example::

    followed = FollowedText(backend_matcher, plan, vocab)
    taken = followed.try_consume(tokens)    # tokens both the backend and the checks take
    followed.rollback(taken)                # both sides back
    after = followed.trial(b'"x"]')         # the scan after those bytes; None: a check breaks
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.schema.array_checks import canonical_text, completable
from constrained.schema.json_scan import ARRAY, Frame, Scan, feed

if TYPE_CHECKING:
    import numpy as np

    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab
    from constrained.schema.array_checks import CheckPlan

MAX_PIECE = 32  # bytes of a token the look-aheads try when they look tokens up by text
MAX_FORCED = 256  # forced bytes ``forced_into_break`` follows
MAX_MATCHES = 4096  # ``contains`` verdicts remembered (items are few; values repeat)


class ItemChecks:
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
            if len(self._matches) >= MAX_MATCHES:
                self._matches.clear()
            found = self.plan.matches(contains, json.loads(text), strict)
            self._matches[memo] = found
        return found

    def closed(self, frame: Frame) -> bool:
        pairs = zip(frame.matched, frame.rules.contains, strict=True)
        return all(n >= contains.at_least for n, contains in pairs)


class FollowedText:
    """A request's backend matcher and its JSON text, followed in step."""

    def __init__(self, inner: Matcher, plan: CheckPlan, vocab: Vocab) -> None:
        self.inner = inner
        self.pieces = vocab.token_bytes()
        self.eos = vocab.eos_token_id
        self.events = ItemChecks(plan)
        self.scan = Scan()
        self.text = bytearray()
        self.history: list[tuple[Scan, int]] = []  # the state before each consumed token

    def advance(self, token: int) -> bool:
        """Follow one token (already taken by the backend); False if it breaks a check,
        with the state left as before it."""
        self.history.append((self.scan.copy(), len(self.text)))
        piece = self.pieces[token] if token != self.eos else b""
        if feed(self.scan, piece, len(self.text), self.text, self.events):
            self.text += piece
            return True
        self.scan, _ = self.history.pop()
        return False

    def hold(self) -> None:
        """A token the backend took that the text does not follow (after an error): its
        history entry, so that a rollback of it stays in step with the backend's."""
        self.history.append((self.scan.copy(), len(self.text)))

    def try_consume(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` both the backend and the checks take (taken by both)."""
        if self.inner.error is not None:
            return 0
        tokens = list(tokens)
        accepted = self.inner.try_consume(tokens)
        for i in range(accepted):
            if not self.advance(tokens[i]):
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

    def trial(self, piece: bytes) -> Scan | None:
        """The scan after ``piece`` were written next (a copy); ``None`` if it breaks a
        check."""
        trial = self.scan.copy()
        return trial if feed(trial, piece, len(self.text), self.text, self.events) else None

    def forced_into_break(self, token: int) -> bool:
        """After ``token``, the bytes the backend forces (llguidance names them) break a
        check."""
        if self.inner.try_consume([token]) != 1:
            return False
        try:
            forced = (self.inner.forced_bytes() or b"")[:MAX_FORCED]
        finally:
            self.inner.rollback(1)
        return self.trial(self.pieces[token] + forced) is None

    def item_text(self, start: int, piece: bytes) -> bytes:
        """The text of the item starting at ``start`` after ``piece`` is written."""
        base = len(self.text)
        return piece[start - base :] if start >= base else bytes(self.text[start:]) + piece

    def since(self, start: int) -> bytes:
        """The text written from ``start`` on."""
        return bytes(self.text[start:])


def innermost_checked(scan: Scan) -> int | None:
    """The index in ``scan.stack`` of the innermost open array with checks, if any."""
    for index in range(len(scan.stack) - 1, -1, -1):
        if scan.stack[index].rules is not None:
            return index
    return None


def has_token(words: np.ndarray, token: int) -> bool:
    """Whether ``token``'s bit is set in a row's uint32 ``words``."""
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)
