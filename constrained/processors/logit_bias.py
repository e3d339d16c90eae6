"""``logit_bias``: add a per-request bias to chosen tokens' logits, before temperature."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.functional import NEUTRAL_BIAS, apply_logit_bias
from constrained.processors.runners import Rows
from constrained.processors.slots import Column

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class LogitBiasProcessor(DualInterfaceProcessor):
    """Adds ``logit_bias[token]`` to ``logits[token]`` for each request that sets it.

    Formula: ``l'[t] = l[t] + bias[t]`` on the raw logits, where vLLM adds its own
    ``logit_bias`` (before penalties and temperature), so greedy decoding can change.

    Example::

        SamplingParams(extra_args={"logit_bias": {11: 100.0}})  # token 11 (",") nearly always
    """

    OPTIONS = frozenset({"logit_bias"})

    def columns(self) -> dict[str, Column]:
        # Padded sparse rows: ids point at token 0 and add the neutral -0.0 where unused.
        return {
            "token_ids": Column(torch.int64, 0, width=1),
            "biases": Column(torch.float32, NEUTRAL_BIAS, width=1),
        }

    # Under V2, a PenaltiesProcessor built right after this one applies the bias in the
    # runner's fused pass (fused_pass.py); this processor's own ``apply`` then does nothing.
    FUSES = "bias"

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The device ``(token_ids, biases)`` tables, [slots, K] each."""
        table = self.slots.device_tables
        return table["token_ids"], table["biases"]

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if ctx is not None and self.fused is not None and self.fused.skips_bias(self):
            return logits
        return super().apply(logits, ctx)

    def is_argmax_invariant(self) -> bool:
        return False

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if not options.logit_bias:
            return False
        self.slots.write(
            slot,
            token_ids=list(options.logit_bias.keys()),
            biases=list(options.logit_bias.values()),
        )
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        return apply_logit_bias(
            logits, self.slots.gather("token_ids", rows), self.slots.gather("biases", rows)
        )
