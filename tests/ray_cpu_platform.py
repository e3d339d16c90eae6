"""Test-only: vLLM's CPU platform with a Ray device key (see ``tests/ray_cluster.py``).

Loaded by vLLM's ``vllm.platform_plugins`` entry point only where ``tests/ray_cluster.py``
puts its ``.dist-info`` on ``PYTHONPATH`` (the Ray test's processes), never otherwise.
"""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform


class RayCpuPlatform(CpuPlatform):
    """vLLM's CPU build leaves ``ray_device_key`` empty, so its Ray executor refuses to start
    ("current platform cpu does not support ray."). The key the CUDA, ROCm and XPU platforms
    use, with each Ray node declaring logical GPUs, is all the executor needs to place one rank
    per bundle."""

    ray_device_key = "GPU"
