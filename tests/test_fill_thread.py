"""``FillThread``: V1's mask fill runs in it while the model runs; its end comes back."""

from __future__ import annotations

import gc
import threading
import time
from types import SimpleNamespace

import pytest

from constrained.processors.mask_fill import FillThread


def test_runs_the_call_in_its_own_thread_and_waits_for_it():
    filler = FillThread("test-fill")
    seen: list[tuple[str, int]] = []
    gate = threading.Event()

    def call(value: int) -> None:
        gate.wait(5)
        seen.append((threading.current_thread().name, value))

    filler.start(call, 7)
    assert seen == []  # the caller goes on while the call waits
    gate.set()
    filler.wait()
    assert seen == [("test-fill", 7)]
    filler.wait()  # nothing running: returns at once


def test_hands_back_what_the_call_raised_and_keeps_serving():
    filler = FillThread("test-fill")

    def fails() -> None:
        raise ValueError("row 3")

    filler.start(fails)
    with pytest.raises(ValueError, match="row 3"):
        filler.wait()
    done: list[int] = []
    filler.start(done.append, 1)
    filler.wait()
    assert done == [1]


def test_one_call_at_a_time():
    filler = FillThread("test-fill")
    gate = threading.Event()
    filler.start(gate.wait, 5)
    with pytest.raises(RuntimeError, match="already running"):
        filler.start(gate.wait, 5)
    gate.set()
    filler.wait()


class _Owner:
    """Holds a ``FillThread`` and hands it its own bound method (as ``V1MaskFill`` does)."""

    def __init__(self) -> None:
        self.filler = FillThread("test-fill-owned")

    def work(self) -> None:
        pass


def test_its_thread_ends_with_its_owner():
    owner = _Owner()
    owner.filler.start(owner.work)
    owner.filler.wait()
    assert any(t.name == "test-fill-owned" for t in threading.enumerate())
    del owner
    gc.collect()
    for _ in range(100):
        if not any(t.name == "test-fill-owned" for t in threading.enumerate()):
            break
        time.sleep(0.02)
    assert not any(t.name == "test-fill-owned" for t in threading.enumerate())


class _Writer:
    """A ``MaskWriter`` stand-in: records which thread each fill ran in, and takes
    ``cost`` seconds of CPU time to write its rows."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.threads: list[str] = []

    def start_step(self) -> None:
        pass

    def ensure_rows(self, num_rows: int) -> None:
        pass

    def advance(self, state: object, new: list[int], row: int) -> None:
        pass

    def finish(self) -> None:
        self.threads.append(threading.current_thread().name)
        began = time.thread_time()
        while time.thread_time() - began < self.cost:
            pass


def _fill_steps(device: str, cost: float, steps: int = 4) -> list[str]:
    """Which thread ran each of ``steps`` fills of ``cost`` seconds (CPU time)."""
    import numpy as np
    import torch

    from constrained.processors.mask_fill import V1MaskFill

    state = SimpleNamespace(output_ids=[], consumed=0, stays_free=lambda: False)
    slots = SimpleNamespace(num_active=1, active=np.array([True]), payload=[state])
    writer = _Writer(cost)
    fill = V1MaskFill(writer, slots, SimpleNamespace(device=torch.device(device)))
    for _ in range(steps):
        fill.before_update()
        fill.after_update(SimpleNamespace(batch_size=1))
    fill.before_update()
    return writer.threads


def test_on_cpu_a_small_fill_runs_inline_after_the_first(monkeypatch):
    import constrained.processors.mask_fill as mask_fill

    monkeypatch.setattr(mask_fill, "INLINE_FILL_S", 1.0)  # a busy machine's wake-up: small
    threads = _fill_steps("cpu", cost=0.0)
    assert threads[0] == "constrained-mask"  # nothing measured yet: the thread
    assert threads[1:] == ["MainThread"] * 3


def test_on_cpu_a_large_fill_stays_in_the_thread():
    assert _fill_steps("cpu", cost=0.002) == ["constrained-mask"] * 4


def test_on_a_gpu_every_fill_goes_to_the_thread():
    assert _fill_steps("cuda", cost=0.0) == ["constrained-mask"] * 4
