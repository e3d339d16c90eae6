"""Per-request token counts kept on the device, for Model Runner V2.

Under V2 a request's tokens live on the device (``req_states.all_token_ids``, valid up to
``total_len``) and the host may not know the newest ones yet. So counts are a dense
``[slots, vocab]`` int32 table updated by device ops, with no host sync: at admission the
prefill (prompt, plus output on resumption) is counted, and each step the tokens committed
since the last step are added (and, with a window, the ones that fell out are removed).

One int32 per entry holds both parts of a count: ``output + prompt * unit``. Without a window
the prompt part is a presence flag (``unit = 2**30``); with a window (at most 32,767 tokens)
it is a count (``unit = 2**16``). Scope ``output`` does not count the prompt, scope
``prompt_and_output`` counts it as output (``unit = 1``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from constrained.options import Options

PRESENCE_UNIT = 1 << 30
WINDOW_UNIT = 1 << 16


def prompt_unit(options: Options) -> int:
    """What one prompt token adds to a count (0: the prompt is not counted)."""
    scope = options.penalty_scope or "default"
    if scope == "output":
        return 0
    if scope == "prompt_and_output":
        return 1
    return WINDOW_UNIT if options.penalty_last_n else PRESENCE_UNIT


class DeviceCounts:
    """Dense packed counts for the slots that use penalties, updated on the device."""

    def __init__(self, req_states: Any, max_new_per_step: int) -> None:
        self.req_states = req_states
        self.device = req_states.device
        capacity, vocab = req_states.max_num_reqs, req_states.vocab_size
        self.max_new_per_step = max_new_per_step
        self.counts = torch.zeros(capacity, vocab, dtype=torch.int32, device=self.device)
        self.counted = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        # Per-slot packing and window, host-written, copied with the slot table.
        self.window = np.zeros(capacity, dtype=np.int64)
        self.unit = np.zeros(capacity, dtype=np.int64)
        self.window_dev = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self.unit_dev = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self._new: list[int] = []

    def add(self, slot: int, options: Options) -> None:
        self.window[slot] = options.penalty_last_n or 0
        self.unit[slot] = prompt_unit(options)
        self._new.append(slot)

    def stage(self) -> None:
        """Count each new request's prefill. Called after vLLM has flushed ``req_states``."""
        if not self._new:
            return
        self.window_dev.copy_(torch.from_numpy(self.window), non_blocking=True)
        self.unit_dev.copy_(torch.from_numpy(self.unit), non_blocking=True)
        tokens = self.req_states.all_token_ids.gpu
        for slot in self._new:  # admission only, not per step
            prompt_len = int(self.req_states.prompt_len.np[slot])
            prefill_len = int(self.req_states.prefill_len.np[slot])
            window, unit = int(self.window[slot]), int(self.unit[slot])
            start = max(0, prefill_len - window) if window else 0
            row = self.counts[slot]
            row.zero_()
            prompt = tokens[slot, start:prompt_len].long()
            if unit == PRESENCE_UNIT:
                row[prompt] = unit  # presence: duplicates write the same value
            elif unit:
                row.index_add_(0, prompt, torch.full_like(prompt, unit, dtype=torch.int32))
            output = tokens[slot, max(start, prompt_len) : prefill_len].long()
            row.index_add_(0, output, torch.ones_like(output, dtype=torch.int32))
            self.counted[slot] = prefill_len
        self._new.clear()

    def catch_up(self, slots: torch.Tensor, active: torch.Tensor) -> None:
        """Count tokens committed since the last step for ``slots`` (device, no sync)."""
        tokens = self.req_states.all_token_ids.gpu
        total = self.req_states.total_len.gpu[slots].long()
        prompt_len = self.req_states.prompt_len.gpu[slots].long()
        counted = self.counted[slots]
        window, unit = self.window_dev[slots], self.unit_dev[slots]
        last = tokens.shape[1] - 1
        for k in range(self.max_new_per_step):
            position = counted + k
            new = active & (position < total)
            token = tokens[slots, position.clamp(max=last)].long()
            self.counts.index_put_((slots, token), new.int(), accumulate=True)
            leaving = position - window
            gone = new & (window > 0) & (leaving >= 0)
            weight = torch.where(leaving < prompt_len, unit, 1)
            token = tokens[slots, leaving.clamp(min=0)].long()
            self.counts.index_put_((slots, token), -(gone * weight).int(), accumulate=True)
        self.counted[slots] = torch.where(active, torch.maximum(counted, total), counted)

    def split(
        self, packed: torch.Tensor, row_slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpack per-row counts into (output part, prompt part); units > 1 are powers of two,
        so the output part is the bits below the unit (all bits when the unit is 0 or 1)."""
        unit = self.unit_dev[row_slots]
        output = packed & torch.where(unit > 1, unit - 1, -1).to(torch.int32).unsqueeze(1)
        return output, packed - output

    def rows(self, row_slots: torch.Tensor, ctx: Any, num_reqs: int) -> torch.Tensor:
        """Packed counts per logits row; speculative rows also count the drafts before them."""
        counts = self.counts[row_slots]
        if counts.shape[0] == num_reqs:
            return counts
        local = ctx.expanded_local_pos.long()
        rows = torch.arange(counts.shape[0], device=counts.device)
        # A request has at most (rows - requests) drafts; the config bounds it tighter.
        max_drafts = min(counts.shape[0] - num_reqs, max(self.max_new_per_step - 1, 0))
        for k in range(1, 1 + (max_drafts or counts.shape[0] - num_reqs)):
            has = local >= k  # draft k-1 (fed at this request's row k) precedes this row
            draft = ctx.input_ids[(rows - local + k).clamp(max=counts.shape[0] - 1)].long()
            counts.index_put_((rows, draft), has.int(), accumulate=True)
        return counts
