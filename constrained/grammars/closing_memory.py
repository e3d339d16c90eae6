"""What a request's closing checks found (``closing_matcher.py``): the suffixes that
completed after a token or a class of tokens, the last few found by walks, and the bridges
(what a walk took after a token before the witness of its row completed).

A row depends on its own request's output only, so this memory is the request's: a later
check tries what it holds (the matcher checks each one again) before walking.

Example::

    memory = SuffixMemory(vocab)
    memory.learn(token, key, suffix, witness)   # a walk found ``suffix`` after ``token``
    memory.recent[token]                        # tried first by the next check of ``token``
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from constrained.grammars.closing_spelling import text_and_bounds
from constrained.grammars.token_shapes import prefix_tokens, token_finish

if TYPE_CHECKING:
    from constrained.grammars.closing_spelling import Spelling
    from constrained.grammars.vocab import Vocab

LEARNT = 8  # suffixes found by walks that every later check tries before a walk of its own
BRIDGES = 256  # bridges a request keeps


class SuffixMemory:
    """A request's found suffixes.

    ``recent``: the last suffix other than the witness's that completed after a token;
    ``recent_by_class``: ... after a member of a wide row's class (a walk's, mostly: ``",``
    needs the next property, a UTF-8 lead byte its continuation). ``learnt``: the last few
    of them, any token's, newest first, each after its token in ``learnt_runs``.
    ``bridges``: what a walk took after a token (key ``-1 - token``) or a member of a class
    (its key) before the witness of its row, or its tail, completed (``\\xa1\\xa2`` after
    the UTF-8 lead byte ``\\xe0``, ``":""`` after a key): tried, with whatever witness a
    later row has, before the suffixes above.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.recent: dict[int, list[int]] = {}
        self.recent_by_class: dict[int, list[int]] = {}
        self.learnt: list[list[int]] = []
        # each learnt suffix after its token, with their text and bounds (``text_and_bounds``)
        self.learnt_runs: list[tuple[list[int], bytes, dict[int, int]]] = []
        self.bridges: OrderedDict[int, tuple[tuple[int, ...], int]] = OrderedDict()

    def after(self, token: int, keys: Sequence[int]) -> list[list[int]]:
        """What an earlier row's check found after ``token`` or a token of its classes."""
        found = (self.recent.get(token), *map(self.recent_by_class.get, keys))
        return [suffix for suffix in found if suffix]

    def learn(self, token: int, key: int | None, suffix: list[int], witness: list[int]) -> None:
        """Remember ``suffix`` (a check's, not the witness's) for the token and its class
        (``key``), and what it adds before ``witness`` as their bridge."""
        self.recent[token] = suffix
        if key is not None:
            self.recent_by_class[key] = suffix
        self._bridge(token, key, suffix, witness)
        if suffix not in self.learnt:
            self.learnt = [suffix, *self.learnt[: LEARNT - 1]]
            run = [token, *suffix]
            found = (run, *text_and_bounds(self.vocab.token_bytes(), run))
            self.learnt_runs = [found, *self.learnt_runs[: LEARNT - 1]]

    def remembered(self) -> set[int]:
        """The tokens (ids) a check may keep on what this request learnt of that very token
        rather than its class: a suffix found after it (``recent``), its bridge, or being
        the first bytes of a learnt completion's text (``realigned``)."""
        known = set(self.recent)
        known.update(-1 - key for key in self.bridges if key < 0)
        for _, text, _ in self.learnt_runs:  # (a strict prefix: ``realigned``'s condition)
            known |= prefix_tokens(self.vocab, text, min(len(text) - 1, 47))
        return known

    def realigned(self, token: int, spelling: Spelling) -> Iterator[list[int]]:
        """The rest of a learnt completion's text after the token's, where the token writes
        its first bytes (``":["`` against ``":[`` ``"a"]}``: ``a"]}``), as the tokenizer
        writes it (``Spelling.rest``): a walk's find serves the tokens that begin the same
        way."""
        piece = self.vocab.token_bytes()[token]
        for run, text, bounds in self.learnt_runs:
            if len(text) > len(piece) and text.startswith(piece):
                rest = spelling.rest(run, text, bounds, len(piece))
                if rest is not None:
                    yield rest

    def bridges_of(self, token: int, key: int | None) -> Iterator[tuple[Sequence[int], int]]:
        """The bridges known for a token, then its class, and for a token that ends inside
        a UTF-8 character or an escape what finishes it (``\\xe0`` -> ``\\xa0`` ``\\x80``,
        ``\\\\`` -> ``"``: ``token_finish``)."""
        for bridged in (-1 - token, key):
            if bridged is not None and bridged in self.bridges:
                yield self.bridges[bridged]
        finish = token_finish(self.vocab, token)
        if finish:
            yield finish, 0

    def _bridge(self, token: int, key: int | None, suffix: list[int], witness: list[int]) -> None:
        """Keep what ``suffix`` adds before ``witness`` (or its tail) as the token's and its
        class's bridge."""
        pieces = self.vocab.token_bytes()
        total = b"".join(pieces[t] for t in suffix)
        bridge = None
        for tail in (0, 1):  # on bytes: a walk's suffix is spelt again (``shortest_spelling``)
            end = b"".join(pieces[t] for t in witness[tail:])
            cut = len(total) - len(end)
            if not end or cut <= 0 or not total.endswith(end):
                continue
            size, k = 0, 0
            while size < cut:  # the suffix's tokens before the witness's text, if one ends there
                size += len(pieces[suffix[k]])
                k += 1
            if size == cut:
                bridge = (tuple(suffix[:k]), tail)
                break
        if bridge is None:
            return
        bridges = self.bridges
        for bridged in (-1 - token, key):
            if bridged is not None:
                bridges[bridged] = bridge
                bridges.move_to_end(bridged)
        while len(bridges) > BRIDGES:
            bridges.popitem(last=False)
