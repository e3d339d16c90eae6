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

    OPTIONS = frozenset({"min_p"})

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        # V1 runs us after vLLM divides by temperature; V2 before, so the request's T scales.
        self.threshold_temperature = self.layout.pick(_after_temperature, _before_temperature)
        self.scratch: dict = {}
        # Under V2, an earlier PenaltiesProcessor of this runner applies min-p in its fused
        # kernels whenever none of our processors between it and this one has a row in the
        # call (penalties.py); only when every processor in the configured list is ours.
        self.fused_with: Any = None
        if self.layout.req_states is not None and _only_ours(vllm_config):
            from constrained.processors.penalties import PenaltiesProcessor

            built = self.peers.live()[:-1]
            owners = [i for i, p in enumerate(built) if isinstance(p, PenaltiesProcessor)]
            if owners:
                owner = built[owners[-1]]
                owner.min_p, owner.between = self, built[owners[-1] + 1 :]
                self.fused_with = owner

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
        fused = ctx is not None and self.fused_with is not None
        if fused and self.fused_with.min_p_done_for is ctx:
            return logits  # done in the penalties' kernels this call
        return super().apply(logits, ctx)

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        if rows.ctx is not None:  # V2: two launches (block maxima, then the mask)
            log_min_p = self.slots.device_tables["log_min_p"]
            return apply_fused_elementwise(
                logits, rows.ctx, bias=None, penalties=None, log_min_p=log_min_p,
                scratch=self.scratch,
            )  # fmt: skip
        return apply_min_p(logits, self.slots.gather("log_min_p", rows))


def _only_ours(vllm_config: Any) -> bool:
    """Whether no foreign processor can run between our penalties and min-p: every class the
    engine's flag names is ours (vLLM builds entry-point plugins first, before the flag's), or,
    without a flag, every ``vllm.logits_processors`` entry point is ours."""
    model_config = getattr(vllm_config, "model_config", None)
    names = list(getattr(model_config, "logits_processors", None) or ())
    if not names:
        from importlib.metadata import entry_points

        names = [ep.value for ep in entry_points(group="vllm.logits_processors")]
    for entry in names:
        name = entry if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"
        if not name.startswith("constrained."):
            return False
    return True


def _after_temperature(params: SamplingParams) -> float:
    return 1.0


def _before_temperature(params: SamplingParams) -> float:
    return params.temperature
