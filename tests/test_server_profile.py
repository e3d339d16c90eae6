"""``benchmarks.server_profile``: a py-spy recording's samples counted per server and part."""

from __future__ import annotations

import pathlib

from benchmarks.server_profile import read, summarise

BENCH = 'process 1:"python -m benchmarks.tool_calls_cold"'


def _line(server: int, depth: int, frames: list[str], count: int) -> str:
    """One raw line: the benchmark, then ``depth`` processes of ``server`` (API, engine core,
    worker; a command line with ``;`` in it, as py-spy writes vLLM's), then ``frames``."""
    chain = [BENCH, f'process {server}:"python -m vllm.entrypoints.openai.api_server"']
    chain += [f'process {server + k}:"python -c from x import y; y(fd=3)"' for k in (1, 2)]
    stack = [*chain[: depth + 1], "thread 0x1", *frames]
    return ";".join(stack) + f" {count}"


def test_parts_counted_per_server_first_part_wins(tmp_path: pathlib.Path) -> None:
    fill = "V1MaskFill._fill (constrained/processors/mask_fill.py:487)"
    closing = "ClosingMatcher._narrow_own (constrained/grammars/closing_matcher.py:235)"
    lines = [
        _line(10, 3, [fill, closing], 30),  # closing, not counted again as the fill's rest
        _line(10, 3, [fill], 20),
        _line(10, 3, ["GPUModelRunner._model_forward (vllm/x.py:1)"], 5),
        _line(10, 2, ["EngineCore.step (vllm/e.py:1)", "FutureWrapper.result (vllm/f.py:2)"], 7),
        _line(20, 3, ["apply_grammar_bitmask (vllm/u.py:191)"], 40),  # vLLM's own server
        _line(20, 1, ["main (vllm/api_server.py:5)"], 3),
        _line(30, 3, ["apply_grammar_bitmask (vllm/u.py:191)"], 4),  # a probe: fewer samples
        f"{BENCH};thread 0x2;main (benchmarks/tool_calls_cold.py:1) 9",  # the benchmark's own
    ]
    raw = tmp_path / "spy.txt"
    raw.write_text("\n".join(lines) + "\n")
    result = summarise(read(raw), rate=10.0)
    ours, vllm = result["ours"], result["vllm"]
    assert ours["seconds"] == {"worker": 5.5, "engine": 0.7}
    assert ours["parts_seconds"]["worker: our fill: closing"] == 3.0
    assert ours["parts_seconds"]["worker: our fill: the rest"] == 2.0
    assert ours["parts_seconds"]["worker: forward: layers"] == 0.5
    assert ours["parts_seconds"]["engine: waiting for the forward pass"] == 0.7
    assert vllm["seconds"] == {"worker": 4.0, "api": 0.3}
    assert vllm["parts_seconds"]["worker: vLLM's grammar mask applied"] == 4.0
