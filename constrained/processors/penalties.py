"""Repetition, frequency and presence penalties, optionally over a window of recent tokens.

The math is ``functional.apply_penalties`` (V1, sparse rows) and ``penalty_kernel`` (V2); the
token counts are ``token_counts.HostPenaltyCounts`` (V1) or ``device_counts.DevicePenaltyCounts``
(V2), chosen once when the processor is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.content_rows import content_rows_for
from constrained.processors.device_counts import DevicePenaltyCounts
from constrained.processors.runners import Rows
from constrained.processors.slots import Column
from constrained.processors.token_counts import HostPenaltyCounts

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

    FUSES = "penalties"
    OPTIONS = frozenset(
        {"repetition_penalty", "frequency_penalty", "presence_penalty", "penalty_last_n",
         "penalty_scope", "penalize_structure"}
    )  # fmt: skip

    def columns(self) -> dict[str, Column]:
        return {
            "repetition": Column(torch.float32, 1.0),
            "frequency": Column(torch.float32, 0.0),
            "presence": Column(torch.float32, 0.0),
            **self._counts_class().COLUMNS,
        }

    def _counts_class(self) -> type[HostPenaltyCounts] | type[DevicePenaltyCounts]:
        return self.layout.pick(HostPenaltyCounts, DevicePenaltyCounts)

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        spec = getattr(vllm_config, "speculative_config", None)
        drafts = getattr(spec, "num_speculative_tokens", 0) or 0
        # The grammar's content classes, for requests that spare the structure.
        content = content_rows_for(self.layout, vllm_config)
        self.counts = self._counts_class()(self.slots, self.layout, 1 + drafts, content)

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
            **self.counts.slot_values(options),
        )
        self.counts.add(slot, options, tokens)  # type: ignore[arg-type]
        return True

    def apply_staged_writes(self) -> None:
        super().apply_staged_writes()
        self.counts.stage()

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        return self.counts.apply(logits, rows)

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """Under V2, the runner's fused pass (``fused_pass.py``): the preceding
        ``logit_bias``, these penalties and, when it can, ``min_p``, in at most three
        launches."""
        if ctx is not None and self.fused is not None and self.fused.runs(self):
            return self.fused.apply(logits, ctx)
        return super().apply(logits, ctx)
