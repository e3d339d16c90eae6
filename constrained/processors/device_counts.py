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

from typing import Any, ClassVar

import torch

from constrained.options import Options
from constrained.processors.penalty_kernel import apply_fused_elementwise
from constrained.processors.runners import Rows
from constrained.processors.slots import Column, SlotTable

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
    """Dense packed counts for the slots that use penalties, updated on the device.

    The ``[slots, vocab]`` table is allocated when the processor is built, before vLLM
    measures memory to size the KV cache (as vLLM's own V2 penalty table is).
    """

    def __init__(self, req_states: Any, max_new_per_step: int) -> None:
        self.req_states = req_states
        self.device = req_states.device
        capacity, vocab = req_states.max_num_reqs, req_states.vocab_size
        self.max_new_per_step = max_new_per_step
        self.counts = torch.zeros(capacity, vocab, dtype=torch.int32, device=self.device)
        self.counted = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self._new: list[tuple[int, int, int]] = []  # (slot, window, unit), counted at stage()

    def add(self, slot: int, window: int, unit: int) -> None:
        self._new.append((slot, window, unit))

    def stage(self) -> None:
        """Count each new request's prefill. Called after vLLM has flushed ``req_states``."""
        if not self._new:
            return
        tokens = self.req_states.all_token_ids.gpu
        for slot, window, unit in self._new:  # admission only, not per step
            prompt_len = int(self.req_states.prompt_len.np[slot])
            prefill_len = int(self.req_states.prefill_len.np[slot])
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

    # The tokens committed since the last step are counted by ``penalty_kernel._prep_kernel``
    # on each request's first row, before the penalties read the table (no host sync).


class DevicePenaltyCounts:
    """The penalties' V2 half: ``DeviceCounts`` plus the Triton kernel that applies them.

    The count table is allocated here, when the processor is built, so vLLM's memory profile
    (which sizes the KV cache) sees it.
    """

    COLUMNS: ClassVar[dict[str, Column]] = {
        "unit": Column(torch.int32, 0),  # how the prompt part is packed (see prompt_unit)
        "window": Column(torch.int32, 0),  # penalty_last_n, 0: no window
    }

    def __init__(
        self, slots: SlotTable, layout: Any, max_new_per_step: int, content: Any = None
    ) -> None:
        self.slots = slots
        self.req_states = layout.req_states
        self.counts = DeviceCounts(self.req_states, max_new_per_step)
        self.scratch: dict = {}  # the fused kernels' block maxima

    @staticmethod
    def slot_values(options: Options) -> dict[str, int]:
        return {"unit": prompt_unit(options), "window": options.penalty_last_n or 0}

    def add(self, slot: int, options: Options, tokens: None) -> None:
        # TODO(#56): penalize_structure=false under V2: counts fed from the grammar's tracker.
        values = self.slot_values(options)
        self.counts.add(slot, values["window"], values["unit"])

    def stage(self) -> None:
        self.counts.stage()

    def apply(
        self,
        logits: torch.Tensor,
        rows: Rows,
        *,
        penalties: bool = True,
        bias: tuple[torch.Tensor, torch.Tensor] | None = None,
        log_min_p: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bias (a neighbour's table), these penalties, then min-p (a neighbour's column), in
        at most three launches: ``penalty_kernel.apply_fused_elementwise``."""
        table = self.slots.device_tables
        tables = None
        if penalties:
            tables = {
                "repetition": table["repetition"],
                "frequency": table["frequency"],
                "presence": table["presence"],
                "unit": table["unit"],
                "window": table["window"],
                "counts": self.counts.counts,
                "counted": self.counts.counted,
                "total_len": self.req_states.total_len.gpu,
                "prompt_len": self.req_states.prompt_len.gpu,
                "all_token_ids": self.req_states.all_token_ids.gpu,
            }
        return apply_fused_elementwise(
            logits, rows.ctx, bias=bias, penalties=tables, log_min_p=log_min_p,
            scratch=self.scratch,
        )  # fmt: skip
