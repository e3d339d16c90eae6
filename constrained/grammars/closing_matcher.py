"""Finishing by ``max_tokens``: the layer of a grammar row that keeps a completion in reach.

``ClosingMatcher`` wraps the rest of a request's stack (backend matcher, array checks) and
knows the request's budget: ``left`` tokens it may still emit, end-of-sequence included. A
token ``t`` is *safe* when some completion follows it in time: ``1 + d(t) + 1 <= left``,
where ``d(t)`` is the length of a completion found from the state after ``t`` (a suffix the
matcher checks; ``closing.completes``). With ``need`` the length of a completion from here
(the witness), ``grow`` a bound of how much one token raises it and ``reach`` the same in
bytes, each row is one of:

- **far** (``left - 2 >= need + reach``): left exactly as the layers below wrote it;
- **within reach** (``need + grow <= left - 2``): a narrow row loses the tokens after which
  no completion fits (``closing_risers.Risers``); a wide one is left as it is;
- **near**: narrowed to exactly its safe tokens (``RowSorter``, each token's check by the
  ``Checker``: a known suffix, else a walk).

Invariant: from the first near row on, every allowed token keeps a completion in reach, so
the output completes by ``max_tokens``; a budget every path fits never narrows a row. When no
completion is found in reach the row is the grammar's and the request is cut at
``max_tokens`` (``length``, never a ``stop``), logged once. docs/budget.md states the method
and its bounds; the parts:

- ``closing_witness.WitnessTracker``: the witness, followed along the output;
- ``closing_check.Checker``: one token's check (``closing_memory.SuffixMemory``: what
  earlier checks found; ``closing_spelling.Spelling``: a witness as text);
- ``closing_row_sort.RowSorter``: a near row's sort (``closing_sorts``: sorts kept, and
  shared by a grammar's requests);
- ``closing_risers.Risers``: a row within reach's risers;
- ``ClosingMatcher`` (here): the budget, and which kind of row this is.

Example::

    stack = closing_layer(grammar, vocab, limit=params.max_tokens)
    stack.consume(new_tokens)
    stack.fill(bitmask, row)   # the grammar's row, narrowed only near the budget
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.closing_check import Checker, Horizon
from constrained.grammars.closing_memory import SuffixMemory
from constrained.grammars.closing_risers import Risers
from constrained.grammars.closing_row_sort import RowSorter, only_the_witness, wide
from constrained.grammars.closing_sorts import Sort, keep_sort, nearest, new_sort, sort_key
from constrained.grammars.closing_spelling import Spelling
from constrained.grammars.closing_tables import MAX_RISE, tables_of
from constrained.grammars.closing_witness import WitnessTracker
from constrained.grammars.matcher import Matcher, MatcherWrapper
from constrained.grammars.token_shapes import in_free_text

if TYPE_CHECKING:
    import torch

    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)

GROW = 8  # the least rise of the need one token is assumed to cause at most
RECHECK_EVERY = 16  # tokens before walking again after a walk found no completion,
# doubled after each such walk in a row (a failed walk runs to its room: 40-100 ms inside a
# string whose ``pattern`` the walk cannot meet, each time, for a row that is cut anyway)
SHORTER_WITNESS_MAX = 16  # a witness this short or shorter is walked for a shorter one
# once where it leaves no slack or one token of it


def closing_layer(
    grammar: Any,
    vocab: Vocab,
    limit: int,
    hints: Sequence[list[int]] = (),
    scratch: torch.Tensor | None = None,
    json: bool = False,
) -> ClosingMatcher:
    """A request's closing layer over a new matcher of ``grammar``: it starts from the root
    witness (with ``hints``, a preempted run's completions), reaches as far as the
    grammar's rise (probed only where it could widen the reach, and only once a row comes
    that near: ``ClosingMatcher.rise``) and shares the grammar's store of near rows
    (``ClosingTables``).
    ``json``: the grammar is a JSON schema's (``ClosingMatcher``)."""
    tables = tables_of(grammar)
    root = tables.root_witness(vocab, scratch)  # walked once per grammar
    hints = [*hints, root] if root is not None else list(hints)
    closing = ClosingMatcher(grammar.matcher(), vocab, limit, hints, scratch, tables.sorts, json)
    if closing.horizon.reach < MAX_RISE:  # (else no rise can widen it: the probe is not walked)
        closing.rise = lambda: tables.rise(vocab, scratch)
    return closing


class ClosingMatcher(MatcherWrapper):
    """The stack below (``inner``) plus the budget: every output completes by ``limit``."""

    def __init__(
        self,
        inner: Matcher,
        vocab: Vocab,
        limit: int,
        hints: Sequence[list[int]] = (),
        scratch: torch.Tensor | None = None,
        shared: OrderedDict | None = None,
        json: bool = False,
    ) -> None:
        super().__init__(inner)
        self.vocab = vocab
        self.eos = vocab.eos_token_id
        self.limit = limit  # max_tokens: output tokens, end-of-sequence included
        self.spent = 0  # output tokens before this stack's first (a thinking block)
        # Tokens consumed through this layer, look-aheads included (an escape's ``\\u``
        # spans tokens); ``count`` is how many.
        self.tokens: list[int] = []
        # One token can open a structure as large as what the output needs from its start
        # (the root witness, the longest hint): checking begins that far from the budget,
        # counted in tokens (``grow``) and in bytes (``reach``: a witness spelt in long
        # tokens, ``"aside":true``, is short, but one token can open text written a token
        # per byte, a date-time's digits).
        grow = max(GROW, max((len(h) for h in hints), default=0))
        pieces = vocab.token_bytes()
        spelt = max((sum(len(pieces[t]) for t in h) for h in hints), default=0)
        self.horizon = Horizon(grow, max(grow, spelt))
        self.memory = SuffixMemory(vocab)
        spelling = Spelling(vocab)
        self.track = WitnessTracker(inner, vocab, self.memory, spelling, hints)
        self.checker = Checker(inner, vocab, self.horizon, self.memory, spelling, scratch, json)
        self.sorter = RowSorter(self.checker)
        self.risers = Risers(self.checker)
        self.narrowed = False  # the last committed near row was narrowed (not by risers)
        self.warned = False
        self.walk_after = 0  # no walk before this count (the last one found nothing)
        self.failed_walks = 0  # walks in a row from the committed state that found nothing
        # The last committed near row's sort (reused while the row stays the same: text
        # inside a string), and the grammar's, shared by its requests (``ClosingTables.sorts``).
        self._last_sort: Sort | None = None
        self.shared = shared
        # The grammar's rise, to widen ``reach`` with (``closing_layer``), probed when a row
        # first comes within ``MAX_RISE`` of the need (``_far``): a rise is at most
        # ``MAX_RISE``, so a row farther away is far whatever it is, and a request that ends
        # before never pays for the probe (12.7 ms a new schema, the median over MaskBench).
        self.rise: Callable[[], int] | None = None

    @property
    def witness(self) -> list[int] | None:
        """A completion from the committed state, where one is known."""
        return self.track.witness

    @property
    def count(self) -> int:
        """Tokens consumed through this layer (look-aheads included)."""
        return len(self.tokens)

    @property
    def left(self) -> int:
        """Tokens the request may still emit here, end-of-sequence included."""
        return self.limit - self.spent - self.count

    # -- following the output -------------------------------------------------------------

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        ok = self.inner.consume(tokens)
        self.tokens += tokens
        self.track.ahead = []
        self.track.follow(tokens, self.tokens, self.horizon.grow)
        return ok and self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        taken = self.inner.try_consume(tokens) if self.error is None else 0
        taken_tokens = list(tokens)[:taken]
        self.track.ahead += taken_tokens
        self.tokens += taken_tokens
        return taken

    def rollback(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        self.inner.rollback(num_tokens)
        del self.tokens[max(len(self.tokens) - num_tokens, 0) :]
        ahead = self.track.ahead
        if num_tokens <= len(ahead):
            del ahead[len(ahead) - num_tokens :]
        else:  # committed tokens undone: what was known of the state is gone
            self.track.forget()
            self._last_sort = self.risers.last = None

    def suffixes(self) -> list[list[int]]:
        """Every completion this layer knows of (``WitnessTracker.suffixes``)."""
        return self.track.suffixes()

    # -- the row -------------------------------------------------------------------------

    def near(self) -> bool:
        """Whether the next row is near the budget (``room < need + grow``) or has no
        completion known: the rows sorted (``_narrow_near``), whose sorts requests of one
        grammar share. Reads only (``WitnessTracker.known``)."""
        witness = self.track.known()
        return witness is None or self.left - 2 < len(witness) + self.horizon.grow

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None:
            return
        committed = not self.track.ahead
        if committed:
            self.narrowed = False
        left = self.left
        if self._far(left - 2, self.track.bound(self.horizon.grow)):
            return  # far: no allowed token can be unsafe
        witness = self.track.known()
        if witness is None and self.count < self.walk_after:
            return  # a walk from near here found nothing: the next one a few tokens on
        witness = self._refreshed(witness, left, committed)
        words = bitmask[row].numpy().view(np.uint32)
        shorter_after_sort = False  # a narrow row's walk for a shorter witness: after its sort
        if witness is not None and committed and self._may_be_shorter(witness, left):
            if wide(words, self.eos):
                witness = self._shorter_in_wide_row(words, witness)
            else:
                shorter_after_sort = True
        if witness is None or len(witness) + 1 > left:
            self._warn(left, None if witness is None else len(witness) + 1)
            return  # no completion found in reach: the grammar's row, and a cut
        room = left - 2
        if self._far(room, len(witness)):
            return
        if room >= len(witness) + self.horizon.grow:  # within reach, not near: risers only
            found = self.risers.narrow(words, witness, left, committed)
            if committed and found is not None:
                self.track.safe = found
            return
        only = only_the_witness(words, witness, self.eos)
        if only is not None:  # (half the near rows of structure in a mixed batch: keys)
            self.track.checked(only, {})
            return
        self._narrow_near(bitmask, row, words, witness, left, shorter_after_sort)

    def _far(self, room: int, need: int) -> bool:
        """``room >= need + reach``: the row is far. The grammar's rise is probed only where
        it decides that (``self.rise``: a rise is at most ``MAX_RISE``)."""
        reach = self.horizon.reach
        if self.rise is not None and need + reach <= room < need + MAX_RISE:
            self.horizon.reach = reach = max(reach, self.rise())
            self.rise = None
        return room >= need + reach

    def _narrow_near(
        self,
        bitmask: torch.Tensor,
        row: int,
        words: np.ndarray,
        witness: list[int],
        left: int,
        shorter_after_sort: bool,
    ) -> None:
        """A near row narrowed to its safe tokens, by a sort (this request's last, the
        grammar's store's, or a new one)."""
        committed = not self.track.ahead
        sort, key, fresh = self._sort(words, witness, left, committed)
        if fresh and shorter_after_sort and sort.unsafe:
            self.track.shortest_tried = True
            shorter = self.checker.walk(len(witness) - 1, looking=True)
            if shorter is not None and len(shorter) < len(witness):
                self.track.witness, self.track.need_bound = shorter, len(shorter)
                return self._narrow_own(bitmask, row)  # the row again, from there
        self.track.checked(sort.safe, sort.by_class)
        if committed:
            self.narrowed = bool(sort.unsafe)
            self._remember(sort, key)
        if sort.unsafe:
            before = words.copy() if not (sort.safe or sort.by_class) else None  # all may go
            sort.unsafe.apply(words)
            empty = before is not None and not words.any()
            if empty and not self.sorter.keep_witness(words, witness, before):
                self._warn(left, None)

    def _sort(
        self, words: np.ndarray, witness: list[int], left: int, committed: bool
    ) -> tuple[Sort, tuple | None, bool]:
        """The row's sort, its key in the grammar's store, and whether it is new: at a
        committed state, this request's last near row's or the store's if either holds
        for this row (``RowSorter.sorted_again``), else sorted now."""
        sort, key = None, None
        if committed:
            sort = self.sorter.sorted_again(self._last_sort, words, witness, left)
            if sort is None and self.shared is not None:
                key = sort_key(witness, words)
                stored = nearest(self.shared.get(key), left)
                sort = self.sorter.sorted_again(stored, words, witness, left)
        if sort is not None:
            return sort, key, False
        kept = words.copy() if committed else words
        return (
            new_sort(kept, witness, left, *self.sorter.sort_tokens(words, witness, left)),
            key,
            True,
        )

    def _refreshed(self, witness: list[int] | None, left: int, committed: bool) -> list[int] | None:
        """The witness from here: the one known, else a walk's (a walk that finds none puts
        the next off by ``RECHECK_EVERY`` tokens, doubled each time); where it does not fit
        the budget, a walk may find a shorter one."""
        if witness is None:
            witness = self.checker.walk(max(left - 1, 0))
            if committed:
                self.failed_walks = 0 if witness is not None else self.failed_walks + 1
                if witness is None:
                    self.walk_after = self.count + (RECHECK_EVERY << (self.failed_walks - 1))
        if committed:
            self.track.commit(witness)
        if witness is not None and len(witness) + 1 > left:
            witness = self.checker.walk(max(left - 1, 0)) or witness
            if committed:
                self.track.commit(witness)
                self.track.shortest_tried = True
        return witness

    def _may_be_shorter(self, witness: list[int], left: int) -> bool:
        """Whether to walk once for a shorter witness: no slack, or one token of it (only
        tokens completing as shortly as the witness, or one token longer: ``\\xc2`` owes a
        byte, ``\\`` a ``"``, stay). A witness followed from far away need not be the
        shortest from here (``":`` ``2`` ``}}`` where ``":""`` ``}}`` also completes): one
        walk, once along it. Not for a long witness: a long walk each time, and an output at
        the least budget admission takes is safest on the one path it was admitted for."""
        return (
            not self.track.shortest_tried
            and (left - 2 <= len(witness) > 1)
            and len(witness) <= SHORTER_WITNESS_MAX
        )

    def _shorter_in_wide_row(self, words: np.ndarray, witness: list[int]) -> list[int]:
        """A wide row's walk for a shorter witness (a narrow row walks after its tokens in
        its sort: its walk waits for a token the sort clears). Inside free text, equal rows
        and witnesses stand for equal states: a walk that found none is not run again."""
        track = self.track
        track.shortest_tried = True
        text = (tuple(witness), hash(words.tobytes())) if in_free_text(self.vocab, words) else None
        shorter = (
            self.checker.walk(len(witness) - 1, looking=True)
            if text is None or text != track.no_shorter
            else None
        )
        if shorter is not None and len(shorter) < len(witness):
            track.witness, track.need_bound = shorter, len(shorter)
            return shorter
        track.no_shorter = text
        return witness

    def _remember(self, sort: Sort, key: tuple | None) -> None:
        """Keep a committed near row's sort for the next rows of this request and, in the
        grammar's store, for other requests (by its words and witness, then its room: a
        sort serves a request with as much room or less)."""
        self.horizon.saw(sort.longest - len(sort.witness))
        self._last_sort = sort
        if self.shared is not None:
            keep_sort(self.shared, sort, key)

    def _warn(self, left: int, needed: int | None) -> None:
        """Say once, in the engine's log, that this request may be cut at ``max_tokens``."""
        if self.warned or self.track.ahead:
            return
        self.warned = True
        found = f"needs {needed} tokens" if needed is not None else "none"
        logger.warning(
            "constrained: no completion of an output found within max_tokens=%d (%d tokens "
            "left; the shortest found: %s): it may be cut at max_tokens (docs/budget.md, "
            "where closing cannot apply)",
            self.limit,
            left,
            found,
        )
