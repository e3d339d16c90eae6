"""``top_n_sigma``: keep tokens within ``n`` standard deviations of the top logit."""

from __future__ import annotations

import torch

from constrained.options import Options
from constrained.processors.truncation import Bounds, TruncationProcessor
from constrained.processors.truncation_kernels import top_n_sigma_bounds_kernel
from constrained.processors.truncation_math import (
    finite_mean_std,
    mean_std_on_host,
    top_n_sigma_bounds,
)


class TopNSigmaProcessor(TruncationProcessor):
    """Top-n-sigma (Tang et al., 2024; llama.cpp's ``top_n_sigma``).

    Keeps ``l >= max(l) - n * std(l)``, ``std`` the population standard deviation of the
    row's finite logits; every other token is removed. Invariant to temperature. Greedy
    requests are left alone.

    Example::

        SamplingParams(temperature=1.0, extra_args={"top_n_sigma": 1.0})
    """

    OPTIONS = frozenset({"top_n_sigma"})
    PARAM = "top_n_sigma"
    NEUTRAL = float("inf")

    def value_of(self, options: Options) -> float | None:
        return options.top_n_sigma

    def bounds(
        self, logits: torch.Tensor, params: dict[str, torch.Tensor], on_host: bool
    ) -> Bounds:
        if self.on_triton:
            return top_n_sigma_bounds_kernel(logits, params["top_n_sigma"])
        mean_std = mean_std_on_host if on_host else finite_mean_std
        return top_n_sigma_bounds(logits, params["top_n_sigma"], mean_std)
