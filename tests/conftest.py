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
    """The real engine, as a user builds it: ``LLM(model)``, no ``logits_processors``; vLLM
    loads ours from the installed package's entry points. Never skipped: CI must run it."""
    from vllm import LLM

    from constrained.demo import engine_kwargs

    engine = LLM(model=tiny_model_dir, **engine_kwargs())
    assert not engine.llm_engine.model_config.logits_processors
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


@pytest.fixture(scope="session")
def parallel_reference(tiny_model_dir: str, tmp_path_factory) -> dict:
    """``tests/parallel_run.py``'s batch (with its reasoning-gate requests) on one worker,
    eager: what every parallel layout must reproduce (``test_parallel.py``, ``test_ray.py``)."""
    from tests.test_parallel import BATCH, run_layout

    return run_layout(tiny_model_dir, tmp_path_factory.mktemp("single"), BATCH)


# A thinking model with tools, as vLLM serves Qwen3.5/3.6.
QWEN36_PARSERS = ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                  "--reasoning-parser", "qwen3")  # fmt: skip


@pytest.fixture(scope="session")
def stock36(tmp_path_factory) -> str:
    """vLLM's STOCK server (``python -m vllm.entrypoints.openai.api_server``, not our launcher)
    on the tiny ``qwen3.6`` model with its tool and reasoning parsers, our package installed
    and named only by ``VLLM_PLUGINS=constrained``, beside another package's processor
    (``tests.foreign_processor``, given with vLLM's own ``--logits-processors``). Its base URL.

    ``--tool-strict-level parameter`` holds non-strict tools' arguments too (vLLM's default,
    ``auto``, holds ``strict`` tools only)."""
    from constrained.tiny_model import build_tiny_model
    from tests.stock_server import start_stock_server

    model = str(build_tiny_model("qwen3.6"))
    flags = (*QWEN36_PARSERS, "--tool-strict-level", "parameter", "--max-model-len", "1024",
             "--max-num-seqs", "8", "--num-gpu-blocks-override", "64",
             "--logits-processors", "tests.foreign_processor:BanTokenProcessor")  # fmt: skip
    handle = start_stock_server(model, tmp_path_factory.mktemp("stock36"), flags)
    try:
        yield handle.base
    finally:
        handle.stop()


# ---- CI: a skip is a gap, not a pass -------------------------------------------------------

# Skips CI accepts: where vLLM itself refuses or cannot give the test a baseline.
EXPECTED_SKIPS = (
    "vLLM refuses offline data parallelism for dense models",  # test_parallel (served DP runs)
    "vLLM alone is not batch-invariant",  # test_seed_invariance: nothing to compare against
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI (``CI`` set, as ``.ci/run``'s machine sets it), fail the run when a test was
    skipped for any other reason (missing data, a client library not installed...): a green
    run must mean every test ran."""
    if not os.environ.get("CI") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    unexpected = []
    for report in skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if not any(allowed in reason for allowed in EXPECTED_SKIPS):
            unexpected.append(f"{report.nodeid}: {reason}")
    if unexpected:
        print("\nCI: unexpected skips (a skip hides a gap; fix the environment or the test):")
        for line in unexpected:
            print(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
