"""The configurations ``throughput`` compares: ours, vLLM's built-in, and ``none``.

Owns each configuration's name, what it adds to a request's ``SamplingParams`` (our
``extra_args`` or vLLM's ``StructuredOutputsParams``) and to the engine's keyword arguments
(our processors registered, or vLLM's ``structured_outputs_config``), the sampling settings
every request shares (temperature, a seed per request), and the environment every process
that builds an engine or a vocabulary sets before importing vLLM.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import SamplingParams

CONFIGS = ("none", "ours", "ours_strict", "ours_xgrammar", "vllm", "vllm_ws")
# extra_args of our configurations, besides the schema.
OURS_EXTRA: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours_strict": {"disable_additional_properties": True},
    # The same backend as vLLM's (auto would pick llguidance): isolates the backend's cost.
    "ours_xgrammar": {"disable_additional_properties": True, "grammar_backend": "xgrammar"},
}
# The engine's structured_outputs_config of vLLM's configurations.
VLLM_STRUCTURED_OUTPUTS: dict[str, dict[str, Any]] = {
    "vllm": {"backend": "xgrammar", "disable_any_whitespace": True},
    "vllm_ws": {"backend": "xgrammar"},
}
TEMPERATURE = 1.0
SEED_BASE = 1000  # request i gets seed SEED_BASE + i


def set_engine_env() -> None:
    """Environment defaults for vLLM on this CPU, offline; call before importing vLLM."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def request_params(config: str, text: str | None, index: int, max_tokens: int) -> SamplingParams:
    """Request ``index``'s parameters under ``config``, constrained to schema ``text``."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    common = {"temperature": TEMPERATURE, "seed": SEED_BASE + index, "max_tokens": max_tokens}
    if config in OURS_EXTRA:
        return SamplingParams(**common, extra_args={"json_schema": text, **OURS_EXTRA[config]})
    if config in VLLM_STRUCTURED_OUTPUTS:
        return SamplingParams(**common, structured_outputs=StructuredOutputsParams(json=text))
    return SamplingParams(**common)


def engine_kwargs_for(config: str) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments of ``config``: the demo engine plus its side's settings."""
    import constrained
    from constrained.demo import engine_kwargs

    kwargs = engine_kwargs()
    if config in OURS_EXTRA:
        kwargs["logits_processors"] = constrained.LOGITS_PROCESSORS
    elif config in VLLM_STRUCTURED_OUTPUTS:
        kwargs["structured_outputs_config"] = dict(VLLM_STRUCTURED_OUTPUTS[config])
    return kwargs
