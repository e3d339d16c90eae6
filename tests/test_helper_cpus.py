"""``helper_cpus``: in a CPU worker that vLLM bound automatically, our helper threads move to
the CPUs of the same NUMA nodes that the binding left out; nowhere else does anything move."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from constrained import helper_cpus
from constrained import settings as settings_module
from constrained.helper_cpus import (
    built_off_compute,
    helper_target,
    leave_compute_cpus,
    numa_nodes,
    omp_cpus,
    spare_cpus,
)
from constrained.processors.mask_fill import FillThread

OMP_VARIABLES = ("KMP_AFFINITY", "GOMP_CPU_AFFINITY", "OMP_PLACES", "VLLM_CPU_OMP_THREADS_BIND")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test decides afresh, from its own environment (vLLM's OpenMP variables unset)."""
    for name in (*OMP_VARIABLES, "CONSTRAINED_HELPER_CPUS"):
        monkeypatch.delenv(name, raising=False)
    settings_module.reset()
    helper_cpus.reset()
    yield
    settings_module.reset()
    helper_cpus.reset()


@pytest.mark.parametrize(
    ("compute", "nodes", "allowed", "spare"),
    [
        ({0}, [{0, 1}], {0, 1}, {1}),  # this machine: vLLM's auto binding keeps CPU 1
        ({0, 1}, [{0, 1}], {0, 1}, set()),  # every CPU computes: nothing to move to
        ({0, 1, 2}, [{0, 1, 2, 3}, {4, 5, 6, 7}], set(range(8)), {3}),  # its own node only
        ({4, 5, 6}, [{0, 1, 2, 3}, {4, 5, 6, 7}], set(range(8)), {7}),
        ({0, 1, 2}, [set(range(8))], {0, 1, 2, 3}, {3}),  # within what the user allowed
    ],
)
def test_spare_cpus(compute, nodes, allowed, spare):
    assert spare_cpus(compute, nodes, allowed) == spare


@pytest.mark.parametrize(
    ("env", "cpus"),
    [
        ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[0,1,2]"}, {0, 1, 2}),
        ({"GOMP_CPU_AFFINITY": "4 5 6"}, {4, 5, 6}),
        ({"OMP_PLACES": "{0,1}", "OMP_PROC_BIND": "true"}, {0, 1}),
        ({"OMP_PLACES": "cores"}, set()),  # a user's own setting, not vLLM's binding
        ({}, set()),
    ],
)
def test_omp_cpus_reads_what_vllm_writes(env, cpus):
    assert omp_cpus(env) == cpus


def _spare_of(first: int) -> set[int]:
    spare = spare_cpus({first}, numa_nodes(), os.sched_getaffinity(os.getppid()))
    if not spare:
        pytest.skip("one CPU in this NUMA node: nowhere to move to")
    return spare


def _as_vllm_binds(monkeypatch) -> tuple[int, set[int]]:
    """The environment vLLM's automatic binding gives a worker computing on one CPU: that
    CPU, and where helper threads should go."""
    first = min(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_PLACES", f"{{{first}}}")
    monkeypatch.setenv("OMP_PROC_BIND", "true")
    return first, _spare_of(first)


def test_the_target_under_vllms_automatic_binding(monkeypatch):
    _, spare = _as_vllm_binds(monkeypatch)
    assert helper_target() == spare


@pytest.mark.parametrize(
    ("variable", "value"),
    [("VLLM_CPU_OMP_THREADS_BIND", "0|1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
     ("CONSTRAINED_HELPER_CPUS", "off")],
)  # fmt: skip
def test_nothing_moves_under_a_users_binding_or_off(monkeypatch, variable, value):
    _as_vllm_binds(monkeypatch)
    monkeypatch.setenv(variable, value)
    assert helper_target() == frozenset()


def test_nothing_moves_without_vllms_binding():  # a GPU worker, the frontend
    assert helper_target() == frozenset()


def test_named_cpus_are_the_target(monkeypatch):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", "1")
    assert helper_target() == {1}


@pytest.mark.parametrize(("raw", "value"), [("", "auto"), ("off", "off"), ("0-2,5", {0, 1, 2, 5})])
def test_the_setting(monkeypatch, raw, value):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", raw)
    assert settings_module.settings().helper_cpus == value


@pytest.mark.parametrize("raw", ["one", "3-0", "0-99999999999"])
def test_a_bad_setting_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", raw)
    with pytest.raises(ValueError, match=f"CONSTRAINED_HELPER_CPUS='{raw}'"):
        settings_module.settings()


def _in_pinned_thread(first: int, run):
    """``run()``'s result in a thread pinned to ``first``, as vLLM pins a worker's threads
    (the rest of the test keeps its own CPUs)."""
    result = []

    def pinned() -> None:
        os.sched_setaffinity(0, {first})
        result.append(run())

    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    return result[0]


def _leave_twice() -> set[int]:
    leave_compute_cpus()
    leave_compute_cpus()  # (a moved thread asks again: the same CPUs, not back)
    return os.sched_getaffinity(0)


def test_a_pinned_thread_leaves_for_the_spare_cpus_and_stays_there(monkeypatch):
    first, spare = _as_vllm_binds(monkeypatch)
    assert _in_pinned_thread(first, _leave_twice) == spare


def test_off_keeps_the_pin(monkeypatch):
    first, _ = _as_vllm_binds(monkeypatch)
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", "off")
    assert _in_pinned_thread(first, _leave_twice) == {first}


def test_the_fill_thread_and_the_pools_it_builds_run_off_the_compute_cpu(monkeypatch):
    """The fill thread leaves; llguidance's pool, built from inside it at its first
    multi-row fill, is built off the compute CPU too."""
    first, spare = _as_vllm_binds(monkeypatch)

    def fill_cpus():
        filler = FillThread("test-fill")
        seen = []
        filler.start(lambda: seen.append((os.sched_getaffinity(0), built_off_compute(
            lambda: os.sched_getaffinity(0)))))  # fmt: skip
        filler.wait()
        return seen[0]

    assert _in_pinned_thread(first, fill_cpus) == (spare, spare)


def test_a_malformed_binding_leaves_the_thread_where_it_is(monkeypatch, caplog):
    monkeypatch.setenv("GOMP_CPU_AFFINITY", "3-0")
    monkeypatch.setattr(helper_cpus, "_warned", False)
    first = min(os.sched_getaffinity(0))
    with caplog.at_level(logging.WARNING, logger="constrained.helper_cpus"):
        assert _in_pinned_thread(first, _leave_twice) == {first}
    assert "helper threads stay on the worker's cores" in caplog.text


def test_a_failed_build_raises_in_the_caller():
    with pytest.raises(KeyError, match="nope"):
        built_off_compute(lambda: {}["nope"])


def test_a_warm_up_thread_runs_at_a_lower_priority_and_no_other():
    # lower_warm_up_priority lowers its own thread only (Linux: a priority per thread).
    seen: dict[str, int] = {}

    def warm_up() -> None:
        helper_cpus.lower_warm_up_priority()
        seen["warm"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=warm_up)
    thread.start()
    thread.join(timeout=60)
    assert seen["warm"] == helper_cpus.WARM_UP_NICE > before
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
