"""``helper_cpus``: in a worker pinned to its compute cores (vLLM's CPU build), our helper
threads move to the cores of the same NUMA nodes that no worker computes on."""

from __future__ import annotations

import os
import threading

import pytest

from constrained import settings as settings_module
from constrained.helper_cpus import (
    built_off_compute,
    leave_compute_cpus,
    numa_nodes,
    spare_cpus,
)
from constrained.processors.mask_fill import FillThread


@pytest.mark.parametrize(
    ("pinned", "nodes", "bound", "spare"),
    [
        ({0}, [{0, 1}], "auto", {1}),  # this machine: vLLM's auto bind keeps CPU 1
        ({0, 1}, [{0, 1}], "auto", set()),  # not pinned (a GPU worker): nothing to leave
        ({0}, [{0, 1}], "0|1", set()),  # two workers, a core each: the other one's is taken
        ({0, 1, 2}, [{0, 1, 2, 3}, {4, 5, 6, 7}], "auto", {3}),  # its own node's spare only
        ({0, 1}, [{0, 1, 2, 3}, {4, 5, 6, 7}], "0-1|2", {3}),
        ({4, 5, 6}, [{0, 1, 2, 3}, {4, 5, 6, 7}], "nobind", {7}),
    ],
)
def test_spare_cpus(pinned, nodes, bound, spare):
    assert spare_cpus(pinned, nodes, bound) == spare


@pytest.mark.parametrize(
    ("raw", "value"), [("", "auto"), ("off", "off"), ("1", frozenset({1})), ("0-2,5", {0, 1, 2, 5})]
)
def test_the_setting(monkeypatch, raw, value):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", raw)
    settings_module.reset()
    try:
        assert settings_module.settings().helper_cpus == value
    finally:
        settings_module.reset()


def test_a_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", "one")
    settings_module.reset()
    try:
        with pytest.raises(ValueError, match="CONSTRAINED_HELPER_CPUS='one'"):
            settings_module.settings()
    finally:
        settings_module.reset()


def _spare_here() -> tuple[int, set[int]]:
    """A CPU to pin a thread to, as vLLM pins a worker, and the CPUs it should then leave for."""
    first = min(os.sched_getaffinity(0))
    spare = spare_cpus({first}, numa_nodes(), "auto") & os.sched_getaffinity(0)
    if not spare:
        pytest.skip("one CPU in this NUMA node: nowhere to move to")
    return first, spare


def _in_pinned_thread(run):
    """``run()``'s result in a thread pinned to one CPU (the rest of the test keeps its own)."""
    first, spare = _spare_here()
    result = []

    def pinned() -> None:
        os.sched_setaffinity(0, {first})
        result.append(run())

    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    return result[0], spare


def test_a_pinned_thread_leaves_for_the_spare_cpus():
    def leave():
        leave_compute_cpus()
        return os.sched_getaffinity(0)

    moved, spare = _in_pinned_thread(leave)
    assert moved == spare


def test_off_keeps_the_pin(monkeypatch):
    monkeypatch.setenv("CONSTRAINED_HELPER_CPUS", "off")
    settings_module.reset()
    try:

        def leave():
            leave_compute_cpus()
            return os.sched_getaffinity(0)

        moved, _ = _in_pinned_thread(leave)
    finally:
        settings_module.reset()
    assert moved == {min(os.sched_getaffinity(0))}


def test_the_fill_thread_started_by_a_pinned_worker_runs_off_its_core():
    def fill_cpus():
        filler = FillThread("test-fill")
        seen = []
        filler.start(lambda: seen.append(os.sched_getaffinity(0)))
        filler.wait()
        return seen[0]

    moved, spare = _in_pinned_thread(fill_cpus)
    assert moved == spare


def test_a_pool_built_for_a_pinned_thread_is_built_off_its_core():
    built, spare = _in_pinned_thread(lambda: built_off_compute(lambda: os.sched_getaffinity(0)))
    assert built == spare


def test_a_failed_build_raises_in_the_caller():
    with pytest.raises(KeyError, match="nope"):
        built_off_compute(lambda: {}["nope"])
