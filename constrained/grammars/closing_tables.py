"""Every table closing keeps for one compiled grammar, in one object (``ClosingTables``):
its root witness, its rise, and the store of near rows' sorts its requests share.

A compiled grammar is cached and serves many requests; what closing learns of it once is
kept with it (``tables_of``: the grammar's ``closing_tables``, made on first use) and goes
when it goes. What the vocabulary alone decides (token classes, ranks) is the vocabulary's
(``token_shapes``, ``closing``).

Example::

    tables = tables_of(grammar)
    witness = tables.root_witness(vocab)   # walked once per grammar
    rise = tables.rise(vocab)              # how far from the budget closing looks
    tables.sorts                           # near rows checked by earlier requests (or None)
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.closing import (
    ROOT_WITNESS_TOKENS,
    allowed_ids,
    completes,
    find_witness,
)
from constrained.grammars.closing_row_sort import EXACT_MAX
from constrained.grammars.closing_sorts import new_store
from constrained.grammars.matcher import words_for
from constrained.grammars.store import GrammarStore, store_key

if TYPE_CHECKING:
    import torch

    from constrained.grammars.vocab import Vocab

RISE_PROBE_MASKS = 512  # masks a grammar's rise probe may walk (``rise``, once a grammar)
RISE_WALK_TOKENS = 96  # ... and one walk of it
MAX_RISE = 1 + RISE_WALK_TOKENS  # the most a rise can be (a walk of at most that many tokens)
_UNKNOWN: Any = object()
_KEPT = "closing"  # the store's backend field of a kept table


class ClosingTables:
    """One compiled grammar's closing tables.

    ``sorts``: the near rows' sorts of every request of the grammar (``closing_sorts``):
    requests with one schema reach the same states (the first row inside each string), and
    the first to check a row checks it for all. ``None`` for a grammar whose rows depend on
    a request's history (``history``: the items an array saw), where equal rows are not
    equal states.
    """

    def __init__(self, grammar: Any) -> None:
        self._grammar = weakref.ref(grammar)  # (the tables live on the grammar)
        self._root: list[int] | None = _UNKNOWN
        self._rise: int | None = None
        self.sorts: OrderedDict | None = None if grammar.history else new_store(grammar)

    @property
    def kept(self) -> tuple[GrammarStore, str] | None:
        """Where the root witness and the rise are kept for other processes: beside the
        compiled grammar in its store (its ``stored_as``, set by ``GrammarCompiler``). Each
        is walked by the first process that needs it (admission walks the root witness for
        its budget check; an engine worker reads it instead of walking it again); the same
        walk, the same result, in any process with this code, tokenizer and spec."""
        return getattr(self._grammar(), "stored_as", None)

    def _matcher(self) -> Any:
        return self._grammar().matcher()

    def root_witness(self, vocab: Vocab, scratch: torch.Tensor | None = None) -> list[int] | None:
        """A completion from the grammar's start (``find_witness`` within
        ``ROOT_WITNESS_TOKENS``), walked once: admission checks a budget against it, and
        each request's closing layer starts from it."""
        if self._root is _UNKNOWN:
            self._root = self._kept_or_walked(
                "root_witness",
                lambda: find_witness(self._matcher(), vocab, ROOT_WITNESS_TOKENS, scratch),
                lambda v: v is None or (type(v) is list and all(type(t) is int for t in v)),
            )
        return self._root

    def rise(self, vocab: Vocab, scratch: torch.Tensor | None = None) -> int:
        """The most one token of a narrow row along the root witness raises the need
        (tokens; 0 when none does), walked once.

        At each state the root witness passes through, every token of a narrow row (at most
        ``EXACT_MAX`` allowed: keys, a value's first token) that the witness's rest does not
        complete after is walked from: ``1 + len(walk) - len(rest)``. It finds what the root
        witness's length cannot: an optional key that opens a value longer than the whole
        witness (``{"a":true}`` is 10 bytes; after ``{"stamp":"`` a date-time needs about 22
        tokens). ``ClosingMatcher`` widens ``reach`` to it, so such a key is kept out while it
        cannot finish. Bounded by ``RISE_PROBE_MASKS`` masks; a walk that finds nothing in
        ``RISE_WALK_TOKENS`` adds nothing (``grow`` still adapts to rises seen later)."""
        if self._rise is None:

            def walk() -> int:
                witness = self.root_witness(vocab, scratch)
                return self._walk_rise(witness, vocab, scratch) if witness else 0

            self._rise = self._kept_or_walked("rise", walk, lambda v: type(v) is int)
        return self._rise

    def _kept_or_walked(self, name: str, walk: Any, valid: Any) -> Any:
        """The table ``name`` as another process kept it (``kept``), if it reads as one
        (``valid``); else walked here, and kept."""
        if self.kept is None:
            return walk()
        store, key = self.kept
        found = store.load(store_key(key, name))
        if found is not None and found[0] == _KEPT:
            try:
                value = json.loads(found[1])
            except ValueError:
                value = _UNKNOWN
            if value is not _UNKNOWN and valid(value):
                return value
        value = walk()
        store.save(store_key(key, name), _KEPT, json.dumps(value).encode())
        return value

    def _walk_rise(self, witness: list[int], vocab: Vocab, scratch: torch.Tensor | None) -> int:
        if scratch is None:
            import torch

            scratch = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
        rise, matcher, masks = 0, self._matcher(), RISE_PROBE_MASKS
        for index, next_token in enumerate(witness):
            rest = witness[index + 1 :]
            matcher.fill(scratch, 0)
            keep = allowed_ids(scratch[0], vocab.width)
            keep[vocab.eos_token_id] = False
            tokens = np.flatnonzero(keep).tolist()
            for token in tokens if len(tokens) <= EXACT_MAX else ():
                if masks <= 0:
                    break
                if token == next_token or completes(matcher, [token, *rest]):
                    continue
                taken = matcher.try_consume([token])
                limit = min(RISE_WALK_TOKENS, masks)
                walk = find_witness(matcher, vocab, limit, scratch, joins=[rest]) if taken else None
                matcher.rollback(taken)
                masks -= limit if walk is None else len(walk) + 1
                if walk is not None:
                    rise = max(rise, 1 + len(walk) - len(rest))
            if not matcher.consume([next_token]):
                break
        return rise


def tables_of(grammar: Any) -> ClosingTables:
    """The grammar's closing tables (``closing_tables``, made on first use)."""
    tables = grammar.__dict__.get("closing_tables")
    if tables is None:
        tables = grammar.closing_tables = ClosingTables(grammar)
    return tables


def root_witness(
    grammar: Any, vocab: Vocab, scratch: torch.Tensor | None = None
) -> list[int] | None:
    """``tables_of(grammar).root_witness``: a completion from the grammar's start."""
    return tables_of(grammar).root_witness(vocab, scratch)
