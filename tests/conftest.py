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


# ---- Two workers: the engines on one, the rest beside them ---------------------------------
# ``make test`` runs ``pytest -n 2``: the modules that start vLLM engines run on one worker, in
# order, so no two engines ever run at once (2 cores, 24 GiB); each other module goes whole
# (its module fixtures built once) to whichever worker is free. An engine keeps about one core
# busy; the CPU-only tests (Triton's interpreter, corpus walks) use the other.

# A module that uses one of these fixtures, or marks a test ``engine``, starts engines.
ENGINE_FIXTURES = frozenset({"llm", "served", "server", "stock36", "parallel_reference"})
# Named here because xdist's scheduler sees node ids only; collection checks the list.
ENGINE_MODULES = frozenset(
    f"tests/test_{name}.py"
    for name in (
        "bad_requests", "budget_engine", "choice_json_object", "clients", "engine",
        "openai_routing", "parallel", "penalty_scope_engine", "plugin_server", "ray",
        "reasoning_engine", "reasoning_tools_server", "samplers_engine", "seed_invariance",
        "server", "soak", "structured_engine", "tool_refs",
    )
)  # fmt: skip
# The longest CPU-only modules (CI machine, 2026-12-03), handed out first after the engines.
LONGEST_FIRST = (
    "tests/test_v2_real_sampler.py", "tests/test_truncation_samplers.py",
    "tests/test_schema_suite.py", "tests/test_launch_counts.py", "tests/test_tiny_model.py",
)  # fmt: skip


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def group_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``engine``, or its module's path."""
    path = module_of(nodeid)
    return "engine" if path in ENGINE_MODULES else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check ``ENGINE_MODULES`` against what the modules use; put the engine tests first and
    the longest modules next (xdist hands units out in the order of their first test)."""
    starts = {
        module_of(item.nodeid)
        for item in items
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
        or item.get_closest_marker("engine")
    }
    collected = {module_of(item.nodeid) for item in items}
    wrong = (starts ^ ENGINE_MODULES) & collected
    if wrong:
        raise pytest.UsageError(
            f"tests/conftest.py: ENGINE_MODULES is wrong for {sorted(wrong)}: a module is listed "
            "exactly when it uses an engine fixture or marks a test `engine`"
        )
    rank = {group: index for index, group in enumerate(("engine", *LONGEST_FIRST))}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduling with our units (``group_of``), in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class EnginesApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # keep the order collection chose
    return EnginesApart(config, log)


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
