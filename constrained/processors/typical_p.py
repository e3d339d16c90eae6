"""``typical_p``: locally typical sampling."""

from __future__ import annotations

from typing import Any

import torch

from constrained.options import Options
from constrained.processors.host_kernels import threads as host_threads
from constrained.processors.truncation import Bounds, TruncationProcessor
from constrained.processors.truncation_kernels import typical_bounds_kernel
from constrained.processors.truncation_math import (
    typical_bounds,
    typical_bounds_native,
    typical_bounds_on_host,
)


class TypicalPProcessor(TruncationProcessor):
    """Locally typical sampling (Meister et al., 2022; llama.cpp's ``typical_p``).

    With ``p = softmax(l)`` and entropy ``H``, tokens are ranked by ``|-log p - H|`` and the
    most typical are kept until their probability exceeds ``typical_p``; the rest are
    removed. Runs before temperature (on the logits as they stand), as llama.cpp runs it.
    Greedy requests are left alone; ``typical_p = 1`` is off.

    Example::

        SamplingParams(temperature=1.0, extra_args={"typical_p": 0.9})
    """

    OPTIONS = frozenset({"typical_p"})
    PARAM = "typical_p"
    NEUTRAL = 1.0

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        # V1 on CPU: the exact host search, in C where it compiles (``host_kernels``; then in
        # blocks of 64 rows: no per-block work to amortize), else NumPy; where Triton runs:
        # its kernels; else torch.
        self.device_bounds = typical_bounds_kernel if self.on_triton else typical_bounds
        if self.host_kernel is not None:
            self.ROWS_PER_BLOCK = 64
        self.host_threads = host_threads(self.host_kernel)

    def value_of(self, options: Options) -> float | None:
        value = options.typical_p
        return None if value is None or value >= 1.0 else value

    def mask_block(self, block: torch.Tensor, params: dict[str, torch.Tensor]) -> bool:
        kernel = self.native_for(block)
        if kernel is None:
            return False
        typical_bounds_native(
            block, params["typical_p"], self.scratch, kernel, mask=True, threads=self.host_threads
        )
        return True

    def bounds(
        self, logits: torch.Tensor, params: dict[str, torch.Tensor], on_host: bool
    ) -> Bounds:
        if on_host:
            kernel = self.native_for(logits)
            if kernel is not None:
                return typical_bounds_native(
                    logits, params["typical_p"], self.scratch, kernel, threads=self.host_threads
                )
            return typical_bounds_on_host(logits, params["typical_p"], self.scratch)
        return self.device_bounds(logits, params["typical_p"])
