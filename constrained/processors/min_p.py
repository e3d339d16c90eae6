"""``min_p``: keep only tokens whose probability is at least ``min_p`` times the top one."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from constrained.options import Options
from constrained.processors.base import GREEDY_TEMPERATURE, DualInterfaceProcessor, Tokens
from constrained.processors.functional import apply_min_p
from constrained.processors.penalty_kernel import apply_fused_elementwise
from constrained.processors.runners import Rows
from constrained.processors.slots import Column

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class MinPProcessor(DualInterfaceProcessor):
    """Min-p sampling: drop tokens with ``p < min_p * p_max``, ``p = softmax(logits / T)``.

    Computed in logit space as ``l < l_max + T * log(min_p)``: one max and one compare per
    row, no softmax. Under Model Runner V1 it is argmax-invariant and runs after vLLM divides
    by temperature (``T = 1`` here), exactly where vLLM's own ``min_p`` runs, so it sees vLLM's
    built-in penalties too. Model Runner V2 calls custom processors before temperature, so
    there the request's own ``T`` scales the threshold; the kept set is the same. Greedy
    requests are left alone (min-p cannot change an argmax).

    Example::

        SamplingParams(temperature=0.8, extra_args={"min_p": 0.1})
    """

    FUSES = "min_p"
    OPTIONS = frozenset({"min_p"})

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        # V1 runs us after vLLM divides by temperature; V2 before, so the request's T scales.
        self.threshold_temperature = self.layout.pick(_after_temperature, _before_temperature)
        self.scratch: dict = {}

    def columns(self) -> dict[str, Column]:
        # T * log(min_p) per slot; -inf disables the row.
        return {"log_min_p": Column(torch.float32, float("-inf"))}

    def is_argmax_invariant(self) -> bool:
        return True

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if not options.min_p or params.temperature < GREEDY_TEMPERATURE:
            return False
        scale = self.threshold_temperature(params)
        self.slots.write(slot, log_min_p=scale * math.log(options.min_p))
        return True

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if ctx is not None and self.fused is not None and self.fused.skips_min_p(self, ctx):
            return logits  # done in the runner's fused pass this call
        return super().apply(logits, ctx)

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        if rows.ctx is not None:  # V2: two launches (block maxima, then the mask)
            log_min_p = self.slots.device_tables["log_min_p"]
            return apply_fused_elementwise(
                logits, rows.ctx, bias=None, penalties=None, log_min_p=log_min_p,
                scratch=self.scratch,
            )  # fmt: skip
        return apply_min_p(logits, self.slots.gather("log_min_p", rows))


def _after_temperature(params: SamplingParams) -> float:
    return 1.0


def _before_temperature(params: SamplingParams) -> float:
    return params.temperature
