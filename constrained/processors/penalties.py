"""Repetition, frequency and presence penalties, optionally over a window of recent tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.device_counts import DeviceCounts
from constrained.processors.functional import (
    apply_penalties,
    apply_sparse_penalties,
    pad_like_first,
)
from constrained.processors.slots import Column
from constrained.processors.token_counts import PendingWrites, TokenHistory

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class PenaltiesProcessor(DualInterfaceProcessor):
    """vLLM/OpenAI-style penalties from a request's own token history.

    For a token counted ``o`` times in the output and ``q`` times in the prompt (per
    ``penalty_scope``; within the last ``penalty_last_n`` tokens when set)::

        l = l / r if l > 0 else l * r      (repetition r, when o + q > 0)
        l = l - f * o - p * (o > 0)        (frequency f, presence p)

    Runs before temperature, after ``logit_bias``, where vLLM applies its own penalties, and
    with vLLM's float32 arithmetic: the default scope gives the same tokens as vLLM's
    built-in ``repetition_penalty`` / ``frequency_penalty`` / ``presence_penalty``.

    Counts are incremental: each step reads only the tokens appended since the last step, and
    only the tokens a request has seen are touched in its logits row.

    Example::

        SamplingParams(extra_args={"repetition_penalty": 1.1, "frequency_penalty": 0.5,
                                   "penalty_last_n": 64})
    """

    @classmethod
    def columns(cls) -> dict[str, Column]:
        return {
            "repetition": Column(torch.float32, 1.0),
            "frequency": Column(torch.float32, 0.0),
            "presence": Column(torch.float32, 0.0),
            "used": Column(torch.int64, 0),  # real columns in the sparse rows below
            "token_ids": Column(torch.int64, 0, width=16),
            "output_counts": Column(torch.int32, 0, width=16),
            "prompt_counts": Column(torch.int32, 0, width=16),
        }

    def is_argmax_invariant(self) -> bool:
        return False

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if not options.has_penalties():
            return False
        self.slots.write(
            slot,
            repetition=options.repetition_penalty or 1.0,
            frequency=options.frequency_penalty or 0.0,
            presence=options.presence_penalty or 0.0,
        )
        if tokens is not None:
            self.slots.payload[slot] = TokenHistory.start(options, *tokens)
        else:
            self._device_counts().add(slot, options)
        return True

    # ---- V2: counts on the device ------------------------------------------------------

    def _device_counts(self) -> DeviceCounts:
        # Allocated on first use: [slots, vocab] int32 is large and most engines never need it.
        if getattr(self, "device_counts", None) is None:
            spec = getattr(self.vllm_config, "speculative_config", None)
            drafts = getattr(spec, "num_speculative_tokens", 0) or 0
            self.device_counts = DeviceCounts(self.req_states, 1 + drafts)
        return self.device_counts

    def apply_staged_writes(self) -> None:
        super().apply_staged_writes()
        if getattr(self, "device_counts", None) is not None:
            self.device_counts.stage()

    def _apply_dense(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        counts = self._device_counts()
        slots = ctx.idx_mapping.long()
        num_reqs = slots.shape[0]
        repetition = self.slots.rows("repetition", slots, num_reqs)
        frequency = self.slots.rows("frequency", slots, num_reqs)
        presence = self.slots.rows("presence", slots, num_reqs)
        counts.catch_up(slots, (repetition != 1) | (frequency != 0) | (presence != 0))
        row_slots = ctx.expanded_idx_mapping.long()
        output, prompt = counts.split(counts.rows(row_slots, ctx, num_reqs), row_slots)
        return apply_penalties(
            logits,
            output,
            prompt,
            self.slots.rows("repetition", row_slots, 0),
            self.slots.rows("frequency", row_slots, 0),
            self.slots.rows("presence", row_slots, 0),
        )

    def apply_rows(
        self, logits: torch.Tensor, row_slots: torch.Tensor | None, ctx: Any = None
    ) -> torch.Tensor:
        if ctx is not None:
            return self._apply_dense(logits, ctx)
        num_rows = logits.shape[0]
        self._catch_up(np.flatnonzero(self.slots.active[:num_rows]))

        def rows(name: str) -> torch.Tensor:
            return self.slots.rows(name, row_slots, num_rows)

        token_ids, output_counts, prompt_counts = pad_like_first(
            rows("used"), rows("token_ids"), rows("output_counts"), rows("prompt_counts")
        )
        return apply_sparse_penalties(
            logits,
            token_ids,
            output_counts,
            prompt_counts,
            rows("repetition"),
            rows("frequency"),
            rows("presence"),
        )

    def _catch_up(self, slots: np.ndarray) -> None:
        """Count the tokens each request produced since the last step (read at apply time:
        GPU async scheduling fills the newest token in only just before apply)."""
        writes = PendingWrites()
        payload = self.slots.payload
        for slot in slots.tolist():
            payload[slot].catch_up(slot, writes)
        table = self.slots
        table.scatter("token_ids", *writes.new_ids, add=False)
        for name, (slots_, cols, deltas) in writes.deltas.items():
            table.scatter(name, slots_, cols, deltas, add=True)
        table.assign("used", *writes.used)
        table.flush()
