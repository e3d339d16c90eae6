"""Another package's logits processor (V1 interface, vLLM's documented shape): it bans the
token id given as ``extra_args["foreign_ban"]``. Served beside ours by the stock server in
``conftest.stock36`` to show another plugin's processor and its key work next to ours."""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

KEY = "foreign_ban"


class BanTokenProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.bans: dict[int, int] = {}

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        value = (sampling_params.extra_args or {}).get(KEY)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{KEY} must be a token id, got {value!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        process_dict_updates(
            self.bans, batch_update, lambda params, _p, _o: (params.extra_args or {}).get(KEY)
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.bans.items():
            logits[row, token] = float("-inf")
        return logits
