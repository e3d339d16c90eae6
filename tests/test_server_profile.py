"""``benchmarks.server_profile``: a py-spy recording's samples counted per server and part."""

from __future__ import annotations

import pathlib

import pytest

from benchmarks.server_profile import read, summarise

BENCH = 'process 1:"python -m benchmarks.tool_calls_cold"'
WORKER = "WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)"
ENGINE = "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:900)"


def _line(server: int, child: int, frames: list[str], count: int) -> str:
    """One raw line: the benchmark, ``server``'s API server, then (``child`` 1: the engine
    core, 2: the worker, 3: another child of the API server) its process, as py-spy writes
    vLLM's (a command line with ``;`` in it), then ``frames``."""
    chain = [BENCH, f'process {server}:"python -m vllm.entrypoints.openai.api_server"']
    spawned = 'python -c from multiprocessing.spawn import spawn_main; spawn_main(fd=3) (x.py:1)"'
    if child in (1, 2):
        chain.append(f'process {server + 1}:"{spawned}')
    if child == 2:
        chain.append(f'process {server + 2}:"{spawned}')
    if child == 3:
        chain.append(f'process {server + 3}:"python -c resource_tracker"')
    return ";".join([*chain, "thread 0x1", *frames]) + f" {count}"


def _recording(tmp_path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    raw = tmp_path / "spy.txt"
    raw.write_text("\n".join(lines) + "\n")
    return raw


def test_parts_counted_per_server_first_part_wins(tmp_path: pathlib.Path) -> None:
    fill = "V1MaskFill._fill (constrained/processors/mask_fill.py:487)"
    closing = "ClosingMatcher._narrow_own (constrained/grammars/closing_matcher.py:235)"
    wait = "FutureWrapper.result (vllm/v1/executor/multiproc_executor.py:2)"
    lines = [
        _line(10, 2, [fill, closing], 30),  # closing, not counted again as the fill's rest
        _line(10, 2, [fill], 20),  # the fill thread: a worker's by its process
        _line(10, 2, [WORKER, "GPUModelRunner._model_forward (vllm/x.py:1)"], 5),
        _line(10, 2, [WORKER, wait], 4),  # an engine part's frame in the worker: not its
        _line(10, 1, [ENGINE, "EngineCore.step (vllm/e.py:1)", wait], 7),
        _line(10, 3, ["main (resource_tracker.py:1)"], 6),  # neither: "other"
        _line(20, 2, [WORKER, "apply_grammar_bitmask (vllm/u.py:191)"], 40),  # vLLM's own
        _line(20, 0, ["main (vllm/api_server.py:5)"], 3),
        _line(30, 2, [WORKER, "apply_grammar_bitmask (vllm/u.py:191)"], 4),  # a probe
        f"{BENCH};thread 0x2;main (benchmarks/tool_calls_cold.py:1) 9",  # the benchmark's own
    ]
    result = summarise(read(_recording(tmp_path, lines)), rate=10.0)
    ours, vllm = result["ours"], result["vllm"]
    assert ours["seconds"] == {"worker": 5.9, "engine": 0.7, "other": 0.6}
    assert ours["parts_seconds"]["worker: our fill: closing"] == 3.0
    assert ours["parts_seconds"]["worker: our fill: the rest"] == 2.0
    assert ours["parts_seconds"]["worker: forward: layers"] == 0.5
    assert ours["parts_seconds"]["engine: waiting for execute_model"] == 0.7
    assert vllm["seconds"] == {"worker": 4.0, "api": 0.3}
    assert vllm["parts_seconds"]["worker: vLLM's grammar mask applied"] == 4.0


def test_a_recording_without_frames_is_refused(tmp_path: pathlib.Path) -> None:
    lines = [f'{BENCH};process 10:"python -m vllm";thread 0x1;main 5']  # --function: no lines
    with pytest.raises(ValueError, match="no frames read"):
        summarise(read(_recording(tmp_path, lines)), rate=10.0)
