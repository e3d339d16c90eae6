"""Session fixtures: one tiny model, one real vLLM engine (CPU build) for the whole run."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every run starts with an empty compiled-grammar store (servers and engines started by the
# tests inherit it), so what a test sees never depends on an earlier run.
os.environ.setdefault("CONSTRAINED_GRAMMAR_STORE", tempfile.mkdtemp(prefix="constrained-store-"))

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
    # Stop the engine process while pytest's streams are still open (quiet teardown).
    engine.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="session")
def served(tiny_model_dir: str, tmp_path_factory):
    """Our launcher (`python -m constrained serve`) on loopback, one per session.

    Started by the soak's ``start_server``: a KV cache of 24 blocks (3,072 tokens, so 64
    concurrent requests force preemption) and the engine's state snapshots enabled.
    """
    from tests.soak import start_server

    handle = start_server(tiny_model_dir, tmp_path_factory.mktemp("server"), 24, 64)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def server(served) -> str:
    """The base URL of the session's server."""
    return served.base
