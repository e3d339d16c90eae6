"""Our helper threads in a vLLM CPU worker: off the cores the model computes on.

vLLM's CPU worker pins its OpenMP threads to the cores it computes on
(``VLLM_CPU_OMP_THREADS_BIND``; ``auto``: the cores of one NUMA node less one, which is kept
for the scheduler's process), and every thread the worker starts afterwards inherits that
pin. A helper thread of ours left there (the mask fill, grammar compiles, the tokenizer's
tables) takes its CPU time from the forward pass: OpenMP's team waits for the thread it
preempted, so on the two-core machine closing's fill came out of the step time almost one
for one. Each helper thread calls ``leave_compute_cpus()`` first and moves to the CPUs of
the same NUMA nodes that no worker is bound to (the reserved core; on x86, the SMT siblings
``auto`` leaves out), beside the scheduler, where vLLM's own structured outputs compute
their masks. Where there are none it stays: a GPU worker is not pinned, and a bind list
that gives every core to a worker leaves none. ``CONSTRAINED_HELPER_CPUS`` (settings):
``off`` keeps the worker's pin, a CPU list (``1,3``) names the CPUs instead.

Example (a worker pinned to CPU 0 of a two-CPU node, ``auto``)::

    spare_cpus(pinned={0}, nodes=[{0, 1}], bound="auto")   # {1}
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from constrained.settings import cpu_list, settings

NODES = Path("/sys/devices/system/node")
T = TypeVar("T")


def spare_cpus(pinned: set[int], nodes: list[set[int]], bound: str) -> set[int]:
    """The CPUs of ``pinned``'s NUMA nodes (``nodes``: each node's CPUs) that neither it nor
    any worker named in ``bound`` (``VLLM_CPU_OMP_THREADS_BIND``: ``0-3|4-7``, ``auto``,
    ``nobind``) computes on."""
    near = set().union(*(node for node in nodes if node & pinned))
    named: set[int] = set()
    if bound not in ("auto", "nobind", ""):
        for worker in bound.split("|"):
            named |= cpu_list(worker)
    return near - pinned - named


def numa_nodes() -> list[set[int]]:
    """Each NUMA node's CPUs, as Linux lists them; one node of every CPU where it does not."""
    try:
        texts = [path.read_text().strip() for path in NODES.glob("node*/cpulist")]
        nodes = [set(cpu_list(text)) for text in texts if text]  # (a node of memory only)
    except (OSError, ValueError):
        nodes = []
    return nodes or [set(range(os.cpu_count() or 1))]


def leave_compute_cpus() -> None:
    """Move the calling thread off the cores its process computes on (module docstring); a
    CPU the process's cpuset does not allow is left out by the kernel, and a move it
    refuses leaves the thread where it is."""
    choice = settings().helper_cpus
    if choice == "off" or not hasattr(os, "sched_setaffinity"):
        return
    if isinstance(choice, frozenset):
        target = set(choice)
    else:
        bound = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip()
        target = spare_cpus(os.sched_getaffinity(0), numa_nodes(), bound)
    if target:
        with contextlib.suppress(OSError):  # (none of them allowed here)
            os.sched_setaffinity(0, target)


def built_off_compute(build: Callable[[], T]) -> T:
    """``build()`` run in a short thread that has left the compute cores: for a native pool
    (llguidance's ``LLExecutor``) whose threads take the CPUs of the thread that builds it,
    whichever thread first needs it."""
    built: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        leave_compute_cpus()
        try:
            built.append(build())
        except BaseException as error:  # raised in the caller
            errors.append(error)

    thread = threading.Thread(target=run, name="constrained-build")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return built[0]
