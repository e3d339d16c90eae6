"""``FillThread``: V1's mask fill runs in it while the model runs; its end comes back."""

from __future__ import annotations

import gc
import threading
import time

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


def test_its_thread_ends_with_its_owner():
    filler = FillThread("test-fill-owned")
    filler.start(lambda: None)
    filler.wait()
    assert any(t.name == "test-fill-owned" for t in threading.enumerate())
    del filler
    gc.collect()
    for _ in range(100):
        if not any(t.name == "test-fill-owned" for t in threading.enumerate()):
            break
        time.sleep(0.02)
    assert not any(t.name == "test-fill-owned" for t in threading.enumerate())
