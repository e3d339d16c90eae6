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

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from constrained.grammars.content import ContentTracker
from constrained.options import Options
from constrained.processors.content_rows import ContentRows
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
        # (slot, window, unit, fed: its output comes from the host), counted at stage()
        self._new: list[tuple[int, int, int, FedSlot | None]] = []

    def add(self, slot: int, window: int, unit: int, fed: FedSlot | None = None) -> None:
        self._new.append((slot, window, unit, fed))

    def stage(self) -> None:
        """Count each new request's prefill. Called after vLLM has flushed ``req_states``."""
        if not self._new:
            return
        tokens = self.req_states.all_token_ids.gpu
        for slot, window, unit, fed in self._new:  # admission only, not per step
            prompt_len = int(self.req_states.prompt_len.np[slot])
            prefill_len = int(self.req_states.prefill_len.np[slot])
            # A fed slot's output (its content tokens) comes from the host, after the prompt.
            end = prompt_len if fed is not None else prefill_len
            start = max(0, end - window) if window else 0
            row = self.counts[slot]
            row.zero_()
            prompt = tokens[slot, start:prompt_len].long()
            if unit == PRESENCE_UNIT:
                row[prompt] = unit  # presence: duplicates write the same value
            elif unit:
                row.index_add_(0, prompt, torch.full_like(prompt, unit, dtype=torch.int32))
            output = tokens[slot, max(start, prompt_len) : end].long()
            row.index_add_(0, output, torch.ones_like(output, dtype=torch.int32))
            self.counted[slot] = prefill_len
            if fed is not None:  # where the prompt's part of the window starts (host values)
                fed.prompt_start, fed.tail = start, max(prompt_len - start, 0)
        self._new.clear()

    # The tokens committed since the last step are counted by ``penalty_kernel._prep_kernel``
    # on each request's first row, before the penalties read the table (no host sync).


@dataclass
class FedSlot:
    """A V2 request whose penalties count content only (``penalize_structure`` off): its
    output counts come from the grammar's content tracker on the host, a few indexed adds
    per step, instead of from ``all_token_ids`` on the device.

    With a window of ``n``, the sequence it slides over is the prompt then the content
    tokens, as under V1 (``token_counts.TokenHistory``).
    """

    window: int
    unit: int  # what one prompt token weighs in the packed count (``prompt_unit``)
    prompt_start: int = 0  # the first prompt position counted at admission
    tail: int = 0  # prompt tokens counted at admission (they leave the window first)
    tracker: ContentTracker | None = None  # bound at the first apply (``bind``)
    counted: int = 0  # content tokens counted

    def bind(self, tracker: ContentTracker | None) -> None:
        if tracker is None:  # (the grammar processor is not loaded: admission refuses this)
            raise RuntimeError("constrained: penalize_structure=false needs the grammar processor")
        self.tracker = tracker

    def catch_up(self, slot: int, out: Deltas) -> None:
        """Append the count changes since the last step: ``+1`` for each new content token,
        and for what it pushes out of the window, ``-1`` (a content token) or ``-unit`` (a
        prompt token: named by its position, read on the device)."""
        tokens = self.tracker.tokens  # type: ignore[union-attr]
        for i in range(self.counted, len(tokens)):
            out.add(slot, tokens[i], 1)
            leaving = self.tail + i - self.window
            if self.window and leaving >= 0:
                if leaving < self.tail:
                    out.add(slot, self.prompt_start + leaving, -self.unit, position=True)
                else:
                    out.add(slot, tokens[leaving - self.tail], -1)
        self.counted = len(tokens)


@dataclass
class Deltas:
    """Count changes gathered on the host: ``(slot, token or position, delta)``."""

    slots: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    positions: list[bool] = field(default_factory=list)

    def add(self, slot: int, id_: int, value: int, position: bool = False) -> None:
        self.slots.append(slot)
        self.ids.append(id_)
        self.values.append(value)
        self.positions.append(position)

    def apply(self, counts: torch.Tensor, all_token_ids: torch.Tensor) -> None:
        """One upload, then one indexed add (a position is read from ``all_token_ids``)."""
        device = counts.device
        host = torch.tensor([self.slots, self.ids, self.values, self.positions], dtype=torch.int64)
        slots, ids, values, positions = host.to(device, non_blocking=True)
        at = all_token_ids[slots, ids.clamp(0, all_token_ids.shape[1] - 1)].long()
        tokens = torch.where(positions.bool(), at, ids)
        counts.index_put_((slots, tokens), values.to(torch.int32), accumulate=True)


# Row flags for the fused kernel (``penalty_kernel``), one int32 per logits row:
SPARE = 1  # a structure row: no penalties
FED = 2  # its request's counts come from the host: the prep kernel counts nothing
DRAFT_BIT = 2  # bit 2 + j: the j-th draft fed before the row is content (counted)


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
        self, slots: SlotTable, layout: Any, max_new_per_step: int, content: ContentRows
    ) -> None:
        self.slots = slots
        self.req_states = layout.req_states
        self.counts = DeviceCounts(self.req_states, max_new_per_step)
        self.scratch: dict = {}  # the fused kernels' block maxima
        self.content = content
        self.device = layout.device

    @staticmethod
    def slot_values(options: Options) -> dict[str, int]:
        return {"unit": prompt_unit(options), "window": options.penalty_last_n or 0}

    def add(self, slot: int, options: Options, tokens: None) -> None:
        values = self.slot_values(options)
        fed = FedSlot(values["window"], values["unit"]) if options.spares_structure() else None
        self.slots.payload[slot] = fed
        self.counts.add(slot, values["window"], values["unit"], fed)

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
        row_flags = self._feed(rows) if penalties else None
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
            scratch=self.scratch, row_flags=row_flags,
        )  # fmt: skip

    def _feed(self, rows: Rows) -> torch.Tensor | None:
        """For the fed requests of this call (none: ``None``, nothing to do): their new
        content tokens added to the table (one upload, one indexed add), and each row's
        flags (``SPARE``, ``FED``, content drafts) for the kernel."""
        ctx = rows.ctx
        payload = self.slots.payload
        fed_slots = [int(s) for s in ctx.idx_mapping_np if payload[int(s)] is not None]
        if not fed_slots:
            return None
        deltas = Deltas()
        for slot in fed_slots:
            fed = payload[slot]
            if fed.tracker is None:
                fed.bind(self.content.tracker(slot))
            fed.catch_up(slot, deltas)
        if deltas.slots:
            deltas.apply(self.counts.counts, self.req_states.all_token_ids.gpu)
        row_slot, local, input_ids = self.content.row_layout(ctx)
        data = self.content.token_bytes()
        flags = np.zeros(rows.count, dtype=np.int32)
        for row in range(rows.count):
            fed = payload[int(row_slot[row])]
            if fed is None:
                continue
            k = int(local[row])
            bits = FED | (0 if fed.tracker.row_open(k) else SPARE)
            drafts = input_ids[row - k + 1 : row + 1].tolist()
            ok = fed.tracker.drafts_content([data[t] if t >= 0 else b"" for t in drafts])
            for j, content in enumerate(ok):
                bits |= int(content) << (DRAFT_BIT + j)
            flags[row] = bits
        return torch.from_numpy(flags).to(self.device, non_blocking=True)
