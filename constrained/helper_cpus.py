"""Our helper threads in a vLLM CPU worker: off the cores the model computes on.

vLLM's CPU worker binds OpenMP to the cores it computes on; with its automatic binding
(``VLLM_CPU_OMP_THREADS_BIND=auto``, the default) it takes the cores of one NUMA node less
one, which it keeps for the scheduler's process, and on x86 one logical CPU per core. Every
thread the worker starts afterwards inherits the pin of its main thread. A helper thread of
ours left there (the mask fill, grammar compiles, the tokenizer's warm-up, llguidance's
fill pool) takes its CPU time from the forward pass: OpenMP's team waits for the thread it
preempted, so on the two-core machine closing's fill came out of the step time almost one
for one. Each helper thread calls ``leave_compute_cpus()`` first and moves to the CPUs of
the same NUMA nodes that vLLM left out (the kept core, the SMT siblings), beside the
scheduler, where vLLM's own structured outputs compute their masks.

Decided once per process (``helper_target``), from what vLLM wrote for OpenMP in the
worker's environment (``omp_cpus``), so every helper thread gets the same CPUs whichever
thread starts it. Nothing moves outside a CPU worker that vLLM bound automatically: a GPU
worker, the frontend, ``nobind``, or a bind list of the user's (``0-3|4-7``: its other
cores may be another worker's or another engine's). ``CONSTRAINED_HELPER_CPUS`` (settings):
``off`` moves nothing; a CPU list (``1,3``) names the CPUs, in any process.

Example (a worker bound to CPU 0 of a two-CPU node)::

    spare_cpus(compute={0}, nodes=[{0, 1}], allowed={0, 1})   # {1}
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from constrained.settings import cpu_list, settings

logger = logging.getLogger(__name__)

NODES = Path("/sys/devices/system/node")
T = TypeVar("T")

_target: frozenset[int] | None = None
_lock = threading.Lock()
_warned = False


def spare_cpus(compute: set[int], nodes: list[set[int]], allowed: set[int]) -> set[int]:
    """The CPUs of ``compute``'s NUMA nodes (``nodes``: each node's CPUs) that the process may
    use (``allowed``) and that OpenMP does not compute on."""
    near = set().union(*(node for node in nodes if node & compute))
    return (near & allowed) - compute


def omp_cpus(env: Mapping[str, str]) -> set[int]:
    """The CPUs vLLM bound this worker's OpenMP threads to, read from the variable it sets
    for the runtime it found (``KMP_AFFINITY``'s proclist for Intel's, ``GOMP_CPU_AFFINITY``
    for GNU's, else ``OMP_PLACES`` as one place ``{0,1,2}``); empty where none is written
    that way (vLLM bound nothing here, or a user's own OpenMP settings)."""
    kmp = re.search(r"proclist=\[([0-9,\s-]+)\]", env.get("KMP_AFFINITY", ""))
    if kmp:
        return set(cpu_list(kmp.group(1)))
    gomp = env.get("GOMP_CPU_AFFINITY", "").split()
    if gomp:
        return set(cpu_list(",".join(gomp)))
    places = re.fullmatch(r"\{([0-9,\s]+)\}", env.get("OMP_PLACES", "").strip())
    return set(cpu_list(places.group(1))) if places else set()


def numa_nodes() -> list[set[int]]:
    """Each NUMA node's CPUs, as Linux lists them; one node of every CPU where it does not."""
    try:
        texts = [path.read_text().strip() for path in NODES.glob("node*/cpulist")]
        nodes = [set(cpu_list(text)) for text in texts if text]  # (a node of memory only)
    except (OSError, ValueError):
        nodes = []
    return nodes or [set(range(os.cpu_count() or 1))]


def _decide() -> frozenset[int]:
    choice = settings().helper_cpus
    if isinstance(choice, frozenset):
        return choice
    if choice == "off":
        return frozenset()
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() != "auto" or not _on_cpu():
        return frozenset()
    compute = omp_cpus(os.environ)
    if not compute:
        return frozenset()
    try:  # what the user let the engine use (vLLM's binding chose among these)
        allowed = os.sched_getaffinity(os.getppid())
    except OSError:
        allowed = set(range(os.cpu_count() or 1))
    return frozenset(spare_cpus(compute, numa_nodes(), allowed))


def _on_cpu() -> bool:
    """Whether vLLM runs on CPU here (the only platform where it binds OpenMP itself)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # (no vLLM here, or it moved)
        return False


def helper_target() -> frozenset[int]:
    """The CPUs this process's helper threads run on; empty: wherever they were started.
    Decided at the first call (the module docstring), the same for every thread after."""
    global _target
    with _lock:
        if _target is None:
            _target = _decide()
        return _target


def reset() -> None:
    """Forget the decision (tests that change the settings or the environment)."""
    global _target
    with _lock:
        _target = None


def leave_compute_cpus() -> None:
    """Move the calling thread to ``helper_target()``'s CPUs, if any. Never raises: a
    malformed variable or a move the kernel refuses (no CPU of the target allowed here)
    leaves the thread where it is, with one warning in the log."""
    global _warned
    try:
        target = helper_target()
        if target and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, target)
    except Exception as error:  # a helper thread must start whatever this finds
        if not _warned:
            _warned = True
            logger.warning("constrained: helper threads stay on the worker's cores: %s", error)


WARM_UP_NICE = 10  # about a tenth of a busy core's time: out of the way, never starved


def lower_warm_up_priority() -> None:
    """Lower the calling thread's CPU priority to ``nice`` ``WARM_UP_NICE`` (Linux sets it per
    thread; the threads it starts inherit it, and it cannot be raised back): the frontend's
    warm-up, which only has to be ahead of the first request, then leaves the CPU to the
    engine's start-up. Not the lowest: a request that waits for a table under way, or for
    the GIL the thread holds, waits for a thread that still runs. Never raises (where it
    cannot, the thread keeps its priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_UP_NICE)
    except (AttributeError, OSError):
        return


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
