"""Incremental per-request token counts for the penalties, kept on the host (Model Runner V1).

Under V1 a request's prompt and output are host lists (vLLM appends to the output list in
place), so each step only the newly appended tokens are read: each adds one count, and with a
window of n tokens the token that falls out of the window removes one. Counts live in a sparse
row per request, one column per distinct token seen, so applying the penalties touches only
those columns instead of the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from constrained.grammars.content import ContentTracker
from constrained.options import Options
from constrained.processors.content_rows import ContentRows
from constrained.processors.functional import apply_sparse_penalties, pad_like_first
from constrained.processors.runners import Rows
from constrained.processors.slots import Column, SlotTable

# Where a prompt token's count goes, per ``penalty_scope``.
PROMPT_TARGET = {"default": "prompt_counts", "output": None, "prompt_and_output": "output_counts"}


@dataclass
class PendingWrites:
    """Element writes gathered across rows, applied as one batched op per column."""

    new_ids: tuple[list[int], list[int], list[int]] = field(default_factory=lambda: ([], [], []))
    deltas: dict[str, tuple[list[int], list[int], list[int]]] = field(
        default_factory=lambda: {"output_counts": ([], [], []), "prompt_counts": ([], [], [])}
    )
    used: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))


@dataclass
class TokenHistory:
    """One request's counted tokens: a column per distinct token, updated as tokens arrive."""

    prompt: Sequence[int]
    output: list[int]  # vLLM's live list: it grows in place every step
    window: int  # 0 = the whole sequence
    prompt_target: str | None
    columns: dict[int, int] = field(default_factory=dict)  # token id -> column
    counted: int = 0  # output tokens already counted
    spares_structure: bool = False
    # Then the grammar's content tracker (bound at the first apply: the grammar's slot table
    # has taken the whole batch update by then), whose ``tokens`` stand for the output and
    # whose ``row_open`` says whether to penalize this step's row.
    tracker: ContentTracker | None = None

    @classmethod
    def start(
        cls, options: Options, prompt: Sequence[int] | None, output: list[int]
    ) -> TokenHistory:
        return cls(
            prompt=prompt or (),
            output=output,
            window=options.penalty_last_n or 0,
            prompt_target=PROMPT_TARGET[options.penalty_scope or "default"],
            spares_structure=options.spares_structure(),
        )

    def bind(self, tracker: ContentTracker | None) -> None:
        """Count the tracker's content tokens instead of the whole output."""
        if tracker is None:  # (the grammar processor is not loaded: admission refuses this)
            raise RuntimeError("constrained: penalize_structure=false needs the grammar processor")
        self.tracker, self.output = tracker, tracker.tokens

    def spared(self) -> bool:
        """This step's row is structure: the penalties leave it as it is."""
        return self.tracker is not None and not self.tracker.row_open()

    def token_at(self, position: int) -> int:
        n_prompt = len(self.prompt)
        return self.prompt[position] if position < n_prompt else self.output[position - n_prompt]

    def _count(self, slot: int, position: int, delta: int, writes: PendingWrites) -> None:
        target = self.prompt_target if position < len(self.prompt) else "output_counts"
        if target is None:
            return
        token = self.token_at(position)
        column = self.columns.get(token)
        if column is None:
            column = self.columns[token] = len(self.columns)
            for lst, value in zip(writes.new_ids, (slot, column, token), strict=True):
                lst.append(value)
        slots, cols, values = writes.deltas[target]
        slots.append(slot)
        cols.append(column)
        values.append(delta)

    def _ready(self) -> int:
        """Output tokens available to count (GPU async scheduling leaves -1 placeholders)."""
        n = len(self.output)
        if n > self.counted and self.output[n - 1] < 0:
            n = self.counted
            while n < len(self.output) and self.output[n] >= 0:
                n += 1
        return n

    def catch_up(self, slot: int, writes: PendingWrites) -> None:
        """Count every token that arrived since the last call (all of them the first time)."""
        ready = self._ready()
        n_prompt = len(self.prompt)
        n_columns = len(self.columns)
        if self.counted == 0 and not self.columns:  # first call: the window over the prefix
            end = n_prompt + ready
            start = max(0, end - self.window) if self.window else 0
            for position in range(start, end):
                self._count(slot, position, 1, writes)
        else:
            for position in range(n_prompt + self.counted, n_prompt + ready):
                self._count(slot, position, 1, writes)
                if self.window and position >= self.window:
                    self._count(slot, position - self.window, -1, writes)
        if len(self.columns) != n_columns:
            writes.used[0].append(slot)
            writes.used[1].append(len(self.columns))
        self.counted = ready


class HostPenaltyCounts:
    """The penalties' V1 half: sparse per-request counts on the host, one column per token seen.

    Each step counts only the tokens appended since the last one (read in ``apply``: GPU async
    scheduling fills the newest token in just before it), then gathers, penalizes and
    scatters back only the logits of tokens a request has seen.
    """

    COLUMNS: ClassVar[dict[str, Column]] = {
        "used": Column(torch.int64, 0),  # real columns in the sparse rows below
        "token_ids": Column(torch.int64, 0, width=16),
        "output_counts": Column(torch.int32, 0, width=16),
        "prompt_counts": Column(torch.int32, 0, width=16),
    }

    def __init__(
        self, slots: SlotTable, layout: Any, max_new_per_step: int, content: ContentRows
    ) -> None:
        self.slots = slots
        self.content = content

    def slot_values(self, options: Options) -> dict[str, int]:
        return {}

    def add(self, slot: int, options: Options, tokens: tuple[Sequence[int], list[int]]) -> None:
        self.slots.payload[slot] = TokenHistory.start(options, *tokens)

    def stage(self) -> None:
        """Nothing to stage: V1 never calls ``apply_staged_writes``."""

    def apply(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        spared = self._catch_up(np.flatnonzero(self.slots.active[: rows.count]))
        gather = self.slots.gather
        repetition = gather("repetition", rows)
        frequency = gather("frequency", rows)
        presence = gather("presence", rows)
        if spared:  # structure rows: the neutral values leave every logit's bits as they are
            keep = torch.ones(rows.count, dtype=torch.bool)
            keep[spared] = False
            keep = keep.to(repetition.device)
            repetition = torch.where(keep, repetition, 1.0)
            frequency = torch.where(keep, frequency, 0.0)
            presence = torch.where(keep, presence, 0.0)
        token_ids, output_counts, prompt_counts = pad_like_first(
            gather("used", rows),
            gather("token_ids", rows),
            gather("output_counts", rows),
            gather("prompt_counts", rows),
        )
        return apply_sparse_penalties(
            logits, token_ids, output_counts, prompt_counts, repetition, frequency, presence
        )

    def _catch_up(self, slots: np.ndarray) -> list[int]:
        """Count the tokens each request produced since the last step; return the rows
        whose request spares the structure and whose row is structure this step."""
        writes = PendingWrites()
        payload = self.slots.payload
        spared = []
        for slot in slots.tolist():
            history = payload[slot]
            if history.spares_structure and history.tracker is None:
                history.bind(self.content.tracker(slot))
            history.catch_up(slot, writes)
            if history.spared():
                spared.append(slot)
        table = self.slots
        table.scatter("token_ids", *writes.new_ids, add=False)
        for name, (slots_, cols, deltas) in writes.deltas.items():
            table.scatter(name, slots_, cols, deltas, add=True)
        table.assign("used", *writes.used)
        table.flush()
        return spared
