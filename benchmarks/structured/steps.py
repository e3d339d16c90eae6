"""Per-step timing of a timed ``generate``: each engine step's time and occupancy, and the fit.

``time_steps`` wraps ``engine.step`` to record (ms, unfinished requests) per step; ``step_fit``
(pure) turns those into the cost of one step at a given number of running requests, so
configurations whose outputs differ in length still compare at equal occupancy.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import median


def time_steps(engine: Any) -> list[tuple[float, int]]:
    """Wrap ``engine.step`` (what ``LLM.generate`` loops on): (ms, unfinished requests) each.

    The wrapper is an instance attribute: ``del engine.step`` restores the class's method.
    """
    steps: list[tuple[float, int]] = []
    original = engine.step

    def timed_step() -> Any:
        running = engine.get_num_unfinished_requests()
        start = time.perf_counter()
        result = original()
        steps.append(((time.perf_counter() - start) * 1000.0, running))
        return result

    engine.step = timed_step
    return steps


def time_calls(engine: Any, name: str) -> list[float]:
    """Wrap the engine's method ``name`` (e.g. ``add_request``): each call's seconds.
    ``del engine.<name>`` restores the class's method."""
    seconds: list[float] = []
    original = getattr(engine, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    setattr(engine, name, timed)
    return seconds


def step_fit(steps: list[tuple[float, int]], at: float) -> dict[str, Any] | None:
    """Least-squares ``ms = intercept + slope * running`` over the decoding steps.

    Leaves out the first two steps (prefill), calls that returned before the engine produced
    anything (< 1 ms) and stalls (> 3x the median step, e.g. the first masks of new
    requests), so the fit is the per-step cost at a given occupancy, whatever the lengths.
    """
    body = [(ms, n) for ms, n in steps[2:] if ms >= 1.0]
    if len(body) < 3:
        return None
    cap = 3.0 * median([ms for ms, _ in body])
    body = [(ms, n) for ms, n in body if ms <= cap]
    xs, ys = [float(n) for _, n in body], [ms for ms, _ in body]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    intercept = my - slope * mx
    return {
        "intercept_ms": intercept,
        "ms_per_running_request": slope,
        "at_running": at,
        "ms_at": intercept + slope * at,
        "steps_used": len(body),
        "running_range": [min(xs), max(xs)],
        "stalls_left_out_ms": [round(ms, 1) for ms, _ in steps[2:] if ms > cap],
    }
