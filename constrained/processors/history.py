"""Each logits row's recent tokens as one ``[rows, width]`` tensor, from either runner.

Processors that look back over a request's tokens (no-repeat-ngram, DRY) work on a history:
the last ``span`` tokens a row can see, right-aligned (newest last), ``-1`` where there is
none. Where the tokens live differs by runner:

- Model Runner V1: host lists (the prompt, and vLLM's live output list): ``host_history``
  copies each using row's tail into one array, uploaded once per step.
- Model Runner V2: ``req_states.all_token_ids`` on the device for committed tokens, and
  ``ctx.input_ids`` for the draft tokens fed before a speculative row: ``device_history``
  gathers them by device ops, no host reads. A ``-1`` placeholder draft stays ``-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def host_history(
    num_rows: int,
    rows: Sequence[int],
    parts: Sequence[Sequence[Sequence[int]]],
    spans: Sequence[int],
) -> np.ndarray:
    """The last ``spans[i]`` tokens of ``parts[i]`` (lists read in order, e.g. prompt then
    output) in row ``rows[i]`` of a ``[num_rows, max(spans)]`` int64 array, ``-1`` elsewhere."""
    width = max(spans, default=0)
    history = np.full((num_rows, width), -1, dtype=np.int64)
    for row, lists, span in zip(rows, parts, spans, strict=True):
        end = width
        for tokens in reversed(lists):  # newest list first; take what the span still needs
            take = min(span - (width - end), len(tokens))
            if take > 0:
                history[row, end - take : end] = tokens[len(tokens) - take :]
                end -= take
    return history


def device_history(
    ctx: Any,
    all_token_ids: torch.Tensor,
    row_slots: torch.Tensor,
    first: torch.Tensor,
    span: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """Each V2 logits row's visible tokens from position ``first[r]`` on, the last ``span[r]``
    of them (0: all), right-aligned in ``width`` columns; committed tokens from
    ``all_token_ids``, the drafts before a speculative row from ``ctx.input_ids``.

    Args:
        ctx: V2's ``LogitsContext`` (``pos``, ``expanded_local_pos``, ``input_ids``).
        all_token_ids: [slots, max_len] committed token ids.
        row_slots: [rows] the slot of each row; first, span: [rows] int64.
    """
    rows = row_slots.shape[0]
    slots = row_slots.long().unsqueeze(1)
    pos = ctx.pos.long().unsqueeze(1)  # the row's own input position
    local = ctx.expanded_local_pos.long().unsqueeze(1)
    first = first.unsqueeze(1)
    visible = (pos + 1 - first).clamp_(min=0)
    span = span.unsqueeze(1)
    span = torch.where(span > 0, torch.minimum(span, visible), visible)
    index = torch.arange(width, device=slots.device).unsqueeze(0) - width + visible
    position = first + index
    committed = all_token_ids[slots, position.clamp(0, all_token_ids.shape[1] - 1)]
    back = pos - position  # how many rows back this request fed that draft
    row = torch.arange(rows, device=slots.device).unsqueeze(1)
    drafts = ctx.input_ids[(row - back).clamp(0, max(rows - 1, 0))]
    tokens = torch.where(position <= pos - local, committed.long(), drafts.long())
    return torch.where(index >= visible - span, tokens, -1)


def device_width(ctx: Any, first_np: np.ndarray, span_np: np.ndarray, used: np.ndarray) -> int:
    """A host bound on any V2 row's history width this step (no device reads): per request,
    its span (0: all) capped by the tokens it can see (``seq_lens_upper_bound_np - first``).

    ``first_np``, ``span_np``, ``used``: per request of ``ctx.idx_mapping_np``."""
    seen = ctx.seq_lens_upper_bound_np - first_np
    limit = np.where(span_np > 0, np.minimum(span_np, seen), seen)[used]
    return int(max(limit.max(initial=0), 0))


class HostRowHistory:
    """Model Runner V1: each using row's history from its host lists (slot payload
    ``(prompt, output)``), the last ``window`` tokens (the slot's ``window_column``; 0: all)."""

    def __init__(self, slots: Any, layout: Any, window_column: str, output_only: bool) -> None:
        self.slots, self.device = slots, layout.device
        self.window_column, self.output_only = window_column, output_only

    def __call__(self, rows: Any) -> torch.Tensor:
        slots = np.flatnonzero(self.slots.active[: rows.count]).tolist()
        windows = self.slots.host_values[self.window_column]
        parts, spans = [], []
        for slot in slots:  # V1's token lists are host objects: read per using row
            prompt, output = self.slots.payload[slot]
            lists = (output,) if self.output_only else (prompt, output)
            total = sum(len(tokens) for tokens in lists)
            parts.append(lists)
            spans.append(min(total, int(windows[slot])) if windows[slot] else total)
        history = host_history(rows.count, slots, parts, spans)
        return torch.from_numpy(history).to(self.device, non_blocking=True)


class DeviceRowHistory:
    """Model Runner V2: each row's history from the device token table and the drafts fed
    before it (``device_history``), width bounded on the host (``device_width``)."""

    def __init__(self, slots: Any, layout: Any, window_column: str, output_only: bool) -> None:
        self.slots, self.states = slots, layout.req_states
        self.window_column, self.output_only = window_column, output_only

    def width(self, rows: Any) -> int:
        """A host bound on any of this call's rows' history width (``device_width``)."""
        slots_np = rows.ctx.idx_mapping_np
        if self.output_only:
            first_np = self.states.prompt_len.np[slots_np]
        else:
            first_np = np.zeros(len(slots_np), dtype=np.int64)
        windows = self.slots.host_values[self.window_column][slots_np]
        return device_width(rows.ctx, first_np, windows, self.slots.active[slots_np])

    def __call__(self, rows: Any) -> torch.Tensor:
        ctx, states = rows.ctx, self.states
        if self.output_only:
            first = states.prompt_len.gpu[rows.slots].long()
        else:
            first = torch.zeros(rows.count, dtype=torch.long, device=rows.slots.device)
        width = self.width(rows)
        span = self.slots.gather(self.window_column, rows)
        return device_history(ctx, states.all_token_ids.gpu, rows.slots, first, span, width)


def row_history(
    slots: Any, layout: Any, window_column: str, output_only: bool
) -> HostRowHistory | DeviceRowHistory:
    """The runner's history reader, chosen once when a processor is built."""
    cls = layout.pick(HostRowHistory, DeviceRowHistory)
    return cls(slots, layout, window_column, output_only)
