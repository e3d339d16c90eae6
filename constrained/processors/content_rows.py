"""One runner's content classes, from its grammar processor to the repetition family (#56).

The grammar processor runs first of ours (``processor_table.py``), so when the penalties,
DRY and no-repeat-ngram run, this step's masks are written and each constrained request's
``ContentTracker`` (``grammars/content.py``) has read every token it will see: which tokens
were content, and whether the row about to be sampled is open. The grammar processor
publishes its slot table here; the others read a slot's tracker. No processor reads
another's attributes.

A runner is its V2 request state, or under V1 its ``VllmConfig`` (one per engine core),
held by a weak reference, as ``fused_pass.py`` keys its pass.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from constrained.grammars.content import ContentTracker

_RUNNERS: dict[int, tuple[weakref.ref, ContentRows]] = {}


class ContentRows:
    """The grammar processor's slots, as the repetition family reads them."""

    def __init__(self) -> None:
        self._grammar_slots: Any = None
        self._fill: Any = None
        self._vocab: Any = None

    def publish(self, slots: Any) -> None:
        """The grammar processor's ``SlotTable`` (its payload: each slot's ``RowState``)."""
        self._grammar_slots = slots

    def publish_fill(self, fill: Any, vocab: Any) -> None:
        """The grammar processor's fill (under V2 its ``last_step`` holds the host copy of
        the step's row layout) and vocabulary."""
        self._fill, self._vocab = fill, vocab

    def token_bytes(self) -> list[bytes]:
        return self._vocab.token_bytes()

    def row_layout(self, ctx: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Under V2, this call's ``(row_slot, local, input_ids)`` on the host, from the
        grammar's one device-to-host copy of the step (it ran first in this call)."""
        last = getattr(self._fill, "last_step", None)
        if last is None or last[0] is not ctx:
            raise RuntimeError("constrained: the grammar processor did not run first in this step")
        step = last[1]
        return step.row_slot, step.local, step.input_ids

    def tracker(self, slot: int) -> ContentTracker | None:
        """The content tracker of the request in ``slot``; None when it has no grammar or
        none of its options spares the structure."""
        if self._grammar_slots is None:
            return None
        state = self._grammar_slots.payload[slot]
        return getattr(state, "content", None)


def spared_rows(content: ContentRows, rows: Any, spares: np.ndarray) -> np.ndarray:
    """This call's logits rows whose request spares the structure (``spares``: a per-slot
    host flag of the calling processor) and whose row is structure: the rows the
    repetition family leaves as they are. Host only (V2: the grammar's copy of the layout).
    """
    if rows.ctx is None:  # V1: row i is slot i
        slots = np.flatnonzero(spares[: rows.count])
        return np.array(
            [s for s in slots.tolist() if not _tracker(content, s).row_open()], dtype=np.int64
        )
    if not spares[rows.ctx.idx_mapping_np].any():
        return np.zeros(0, dtype=np.int64)
    row_slot, local, _ = content.row_layout(rows.ctx)
    mine = np.flatnonzero(spares[row_slot]).tolist()
    return np.array(
        [r for r in mine if not _tracker(content, int(row_slot[r])).row_open(int(local[r]))],
        dtype=np.int64,
    )


def row_flags(spared: np.ndarray, num_rows: int, device: Any) -> torch.Tensor | None:
    """``spared`` as a [rows] int32 flag tensor for a kernel (1: leave the row); None when
    no row is spared (the kernel then reads no flags)."""
    if not spared.size:
        return None
    flags = np.zeros(num_rows, dtype=np.int32)
    flags[spared] = 1
    return torch.from_numpy(flags).to(device, non_blocking=True)


def _tracker(content: ContentRows, slot: int) -> ContentTracker:
    tracker = content.tracker(slot)
    if tracker is None:  # (the grammar processor is not loaded: admission refuses this)
        raise RuntimeError("constrained: penalize_structure=false needs the grammar processor")
    return tracker


def content_rows_for(layout: Any, vllm_config: Any) -> ContentRows:
    """The ``ContentRows`` of the runner that built ``layout``."""
    owner = layout.req_states if layout.req_states is not None else vllm_config
    for key in [k for k, (ref, _) in _RUNNERS.items() if ref() is None]:
        del _RUNNERS[key]
    entry = _RUNNERS.get(id(owner))
    if entry is None or entry[0]() is not owner:
        entry = _RUNNERS[id(owner)] = (_ref(owner), ContentRows())
    return entry[1]


def _ref(owner: Any) -> Any:
    """A weak reference to ``owner``; a strong one for an object that takes none (the
    ``SimpleNamespace`` configs of tests)."""
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner
