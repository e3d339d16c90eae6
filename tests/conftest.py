"""Session fixtures: one tiny model, one real vLLM engine (CPU build) for the whole run."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from constrained.tiny_model import build_tiny_model

    return str(build_tiny_model())


@pytest.fixture(scope="session")
def llm(tiny_model_dir: str):
    """The real engine with our processors registered. Never skipped: CI must run it."""
    from vllm import LLM

    import constrained
    from constrained.demo import engine_kwargs

    engine = LLM(
        model=tiny_model_dir, logits_processors=constrained.LOGITS_PROCESSORS, **engine_kwargs()
    )
    yield engine
    del engine
