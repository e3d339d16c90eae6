"""Shared pieces of the benchmarks: option values, machine info, stats.

Imports nothing heavy at module level (no torch, no vLLM), so a parent process can use it
before deciding which environment variables its children need.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
from typing import Any

# Logits widths of the two embedded tiny models (constrained.tiny_model.VOCABS).
WIDTHS: dict[str, int] = {"qwen2": 151_936, "qwen3.6": 248_320}

# The option values every benchmark applies, once through vLLM's built-ins and once through ours.
# Ten fixed token ids with biases +1, -1, +2, -2, ... +5, -5.
LOGIT_BIAS: dict[int, float] = {
    100 * (i + 1): float((i // 2 + 1) * (1 if i % 2 == 0 else -1)) for i in range(10)
}
PENALTIES: dict[str, float] = {
    "repetition_penalty": 1.1,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
}
MIN_P = 0.05


def vllm_builtin_kwargs() -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the ``vllm`` configuration (all five options)."""
    return {**PENALTIES, "min_p": MIN_P, "logit_bias": dict(LOGIT_BIAS)}


def ours_extra_args() -> dict[str, Any]:
    """``extra_args`` for the ``ours`` configuration (the same five options)."""
    return {"min_p": MIN_P, "logit_bias": dict(LOGIT_BIAS), **PENALTIES}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict[str, Any]:
    """Where and how the numbers were taken (torch and vLLM are imported here)."""
    import torch

    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:  # pragma: no cover - the benchmarks need vLLM anyway
        vllm_version = None
    import constrained

    return {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "vllm": vllm_version,
        "constrained": constrained.__version__,
        "logits_processors": list(constrained.LOGITS_PROCESSORS),
        "git_commit": _git_commit(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
    }


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float]) -> float:
    return statistics.median(values)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]
