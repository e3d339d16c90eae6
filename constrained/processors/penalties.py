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

    OPTIONS = frozenset(
        {"repetition_penalty", "frequency_penalty", "presence_penalty", "penalty_last_n",
         "penalty_scope"}
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
        self.counts = self._counts_class()(self.slots, self.layout, 1 + drafts)
        # Under V2, the neighbours whose work this processor's kernels do (see ``apply``).
        self.bias: Any = None  # the LogitBiasProcessor built just before this one
        self.min_p: Any = None  # a MinPProcessor built after, set by it (min_p.py)
        self.between: list[Any] = []  # our processors between this one and that min-p
        self.min_p_done_for: Any = None  # the V2 call whose min-p the kernels applied
        if self.layout.req_states is not None:
            from constrained.processors.logit_bias import LogitBiasProcessor

            built = self.peers.live()
            if len(built) >= 2 and isinstance(built[-2], LogitBiasProcessor):
                self.bias = built[-2]
                self.bias.fused_with = self

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
        """Under V2, one fused step for the rows of this call that need it: the preceding
        ``logit_bias`` (which then does nothing itself), these penalties, and ``min_p`` when
        none of our processors between here and it has a row in this call (it runs last of
        ours, so its result is the same). At most three launches; skipped parts cost none."""
        if ctx is None or self.layout.req_states is None:
            return super().apply(logits, ctx)
        bias = self.bias is not None and self.bias.uses_rows(ctx)
        penalties = self.uses_rows(ctx)
        min_p = (
            self.min_p is not None
            and self.min_p.uses_rows(ctx)
            and not any(peer.uses_rows(ctx) for peer in self.between)
        )
        self.min_p_done_for = ctx if min_p else None
        if not (bias or penalties or min_p):
            return logits
        rows = Rows(logits.shape[0], ctx.expanded_idx_mapping, ctx)
        return self.counts.apply(
            logits,
            rows,
            penalties=penalties,
            bias=self.bias.tables() if bias else None,
            log_min_p=self.min_p.slots.device_tables["log_min_p"] if min_p else None,
        )
