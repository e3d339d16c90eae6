"""A request's first row without its compile: admission's, kept in the store, written by
an engine whose compile of the same grammar still runs (``stack.py`` builds the stack).

A logits processor cannot hold one row out of the batch (vLLM keeps such a request out,
``WAITING_FOR_FSM``), so a row whose compile still runs at its first mask would hold the
whole step. Admission has compiled the same grammar: it writes the request's first row with
the same stack (``start_row``) and keeps it beside the grammar in the compiled-grammar store,
per budget (``keep_start_row``), where that row depends on the grammar and the budget alone:
no thinking gate (its rows wait for no compile anyway), closing does not find it near the
budget (a near row is sorted, and a sort may be another request's, ``closing_sorts``), and
it allows at most ``START_ROW_MAX`` tokens. An engine whose compile still runs reads it
(``kept_start_row``) and writes it (``StartRow``); the stack, built at the next row, writes
the first row again aside (``replay_start``), so it stands where a stack built in time
stands, whichever came first: the same rows and outputs at every timing, on every rank.

Example::

    keep_start_row(grammar, vocab, max_tokens, "json_schema")   # admission
    ids = kept_start_row(compiler, spec, max_tokens)            # the engine, compile running
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.matcher import Matcher, fill_only, row_ids, words_for
from constrained.grammars.stack import AnswerLayers
from constrained.grammars.store import store_key

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from constrained.grammars.compiler import GrammarCompiler
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)

START_ROW_MAX = 64  # the most tokens a kept start row allows (a JSON value's or a tool
# call's first token: a few; free text's thousands are not kept, and their rows wait)
_START_ROW = "stack"  # the store's backend field of a kept start row


class StartRow(Matcher):
    """A request's first row while its compile still runs: the row admission's stack wrote
    (``start_row``), read from the store. Written only: the writer builds the request's
    stack before its first token (``RowState.ready_matcher``), so nothing is consumed here."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.error: str | None = None

    def consume(self, tokens: Sequence[int]) -> bool:
        raise RuntimeError("a start row consumes nothing: the stack is built first")

    def try_consume(self, tokens: Sequence[int]) -> int:
        return 0

    def rollback(self, num_tokens: int) -> None:
        """Nothing was consumed."""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        fill_only(bitmask, row, self.ids)

    def accepts_end(self) -> bool:
        return False


def _first_row(matcher: Matcher, vocab: Vocab) -> np.ndarray:
    """A stack's row (``fill``: the bottom's, then each layer's ``narrow``, as the writer
    writes it), in a bitmask row of its own; its uint32 words."""
    import torch

    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    matcher.fill(bitmask, 0)
    return bitmask[0].numpy().view(np.uint32)


def start_row(grammar: Any, vocab: Vocab, limit: int | None, kind: str) -> list[int] | None:
    """The first row of a request of ``grammar`` without a thinking gate (``limit``: its
    ``max_tokens`` when it closes by them), as its stack writes it, when another request of
    the grammar cannot change it and it allows at most ``START_ROW_MAX`` tokens; else
    ``None``. Closing must not find the row near the budget: a near row is sorted, and a
    sort may reuse another request's (``closing_sorts``); far or within reach, the row
    depends on the grammar and the budget alone."""
    future: Future = Future()
    future.set_result(grammar)
    answer = AnswerLayers(future, vocab, limit, (), None, kind)
    matcher = answer.matcher()
    if answer.failed or (answer.closing is not None and answer.closing.near()):
        return None
    ids = row_ids(_first_row(matcher, vocab))
    if matcher.error is not None or not 0 < ids.size <= START_ROW_MAX:
        return None
    return ids.tolist()


def _start_row_name(limit: int | None) -> str:
    return f"start_row_{limit}"


def keep_start_row(grammar: Any, vocab: Vocab, limit: int | None, kind: str) -> None:
    """Admission: keep the grammar's ``start_row`` for ``limit`` in its store (where it was
    stored, ``stored_as``; none without a store), once per grammar and budget."""
    kept = getattr(grammar, "stored_as", None)
    if kept is None:
        return
    store, key = kept
    name = store_key(key, _start_row_name(limit))
    try:
        if store.load(name) is None:
            ids = start_row(grammar, vocab, limit, kind)
            store.save(name, _START_ROW, json.dumps(ids).encode())
    except Exception:  # (the engine's row then waits for its compile, as without it)
        logger.warning("constrained: the start row of a %s was not kept", kind, exc_info=True)


def kept_start_row(
    compiler: GrammarCompiler, spec: GrammarSpec, limit: int | None
) -> list[int] | None:
    """The engine: the start row admission kept for ``spec`` and ``limit``, if any (ids
    within the vocabulary, at most ``START_ROW_MAX``)."""
    if compiler.store is None:
        return None
    found = compiler.store.load(store_key(compiler.key_of(spec), _start_row_name(limit)))
    if found is None or found[0] != _START_ROW:
        return None
    try:
        ids = json.loads(found[1])
    except ValueError:
        return None
    width = compiler.vocab.width
    if (
        type(ids) is not list
        or not 0 < len(ids) <= START_ROW_MAX
        or not all(type(t) is int and 0 <= t < width for t in ids)
    ):
        return None
    return ids


def replay_start(matcher: Matcher, vocab: Vocab) -> None:
    """A stack built after its request's first row was a ``StartRow``: that row written
    again, aside, so the stack's layers (closing's checks) stand where they would have."""
    _first_row(matcher, vocab)
