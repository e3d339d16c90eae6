"""Our processors under tensor, pipeline and data parallelism (issue #17), on the real engine.

Each layout runs ``tests/parallel_run.py`` in its own process tree (one engine at a time): a
mixed batch of 18 requests (JSON schema, regex, windowed penalties, bias + min-p, DRY,
no-repeat-ngram, XTC + top-n-sigma, plain, a reasoning gate before the JSON schema; sampled
and greedy; 64 tokens at most) on a KV cache of 10 blocks, so requests are preempted and
recomputed. Every layout must give the single worker's tokens,
token for token, with our options. The same batch without options is run in the same engine
first: where a layout changes vLLM's own tokens (its arithmetic differs), that layout is
skipped, naming it, since our processors cannot be judged there.

On this 2-core CPU each worker gets one core (``VLLM_CPU_OMP_THREADS_BIND``; vLLM's automatic
binding wants a NUMA node per worker). Pipeline parallelism runs compiled: the CPU build's
eager mode never allocates the later stages' input buffers (``docs/scaling.md``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.output_checks import check_output
from tests.parallel_run import REGEX, SCHEMA
from tests.process_sessions import kill_sessions

REPO = Path(__file__).resolve().parents[1]

# Every layout runs the batch with its reasoning-gate requests too (``--reasoning``), 64 tokens
# at most per request (the runner's default is 96): the KV cache still preempts, the JSON,
# regex and reasoning requests finish as at 96 (the same tokens), in two thirds of the steps.
BATCH = ["--reasoning", "--max-tokens", "64"]
LAYOUTS = {
    "tensor_parallel_2": ["--tp", "2", *BATCH],
    "pipeline_parallel_2": ["--pp", "2", "--compiled", *BATCH],
    "served_data_parallel_2": ["--serve-dp", "2", *BATCH],
    "offline_data_parallel_2": ["--dp", "2", *BATCH],
}
# vLLM's own refusals of a layout on this build, by the text it fails with.
VLLM_REFUSES = {
    "Offline data parallel mode is not supported/useful for dense models": (
        "vLLM refuses offline data parallelism for dense models (served DP is tested)"
    ),
}


def one_core_per_worker() -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving two workers one allowed core each."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail(f"two workers need two cores; this process may use {cores}")
    return f"{cores[0]}|{cores[1]}"


def run_layout(
    model: str, workdir: Path, args: list[str], extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "result.json"
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=one_core_per_worker(), **(extra_env or {}))
    for key in ("PARALLEL_DIGEST_DIR", "CONSTRAINED_STATS_PATH"):
        env.pop(key, None)  # the runner puts both in its work directory
    cmd = [sys.executable, "-m", "tests.parallel_run", model, *args, "--out", str(out)]
    # In its own session: whatever happens here (a timeout, an interrupt), nothing it started
    # outlives this call (vLLM's engine process survives a runner that is killed).
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=900)
    finally:
        kill_sessions([proc.pid])
        proc.wait()
    for text, reason in VLLM_REFUSES.items():
        if proc.returncode != 0 and text in stderr:
            pytest.skip(f"{' '.join(args)}: {reason}")
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single(parallel_reference: dict[str, Any]) -> dict[str, Any]:
    """The reference: one worker, eager, the same batch and KV cache (``conftest.py``: one
    run per session, shared with ``tests/test_ray.py``)."""
    return parallel_reference


def differing(a: list[dict], b: list[dict], reqs: list[dict]) -> list[str]:
    return [
        f"{r['kind']} (temperature {r['params']['temperature']})"
        for r, x, y in zip(reqs, a, b, strict=True)
        if x["token_ids"] != y["token_ids"]
    ]


def test_single_worker_reference_is_sound(single: dict[str, Any]) -> None:
    """The reference itself: preempted, its constrained outputs valid, one worker's digests."""
    assert single["preemptions"] > 0, "the small KV cache should force preemption"
    assert list(single["digests"]) == ["single"]
    checked = 0
    for req, out in zip(single["requests"], single["options"], strict=True):
        if out["finish_reason"] != "stop":
            continue
        if req["kind"] == "json_schema":
            assert check_output(out["text"], SCHEMA) == ("valid", None), out["text"]
            checked += 1
        elif req["kind"] == "regex":
            assert re.fullmatch(REGEX, out["text"]), out["text"]
            checked += 1
    assert checked == 4, "both JSON and both regex requests should finish"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_gives_the_single_workers_tokens(
    layout: str, single: dict[str, Any], tiny_model_dir: str, tmp_path_factory
) -> None:
    result = run_layout(tiny_model_dir, tmp_path_factory.mktemp(layout), LAYOUTS[layout])
    reqs = single["requests"]
    assert result["preemptions"] > 0, "the small KV cache should force preemption"

    vllm_changed = differing(single["plain"], result["plain"], reqs)
    if vllm_changed:
        pytest.skip(f"{layout}: vLLM alone (no options) changes the tokens of {vllm_changed}")
    assert differing(single["options"], result["options"], reqs) == []
    assert [o["finish_reason"] for o in result["options"]] == [
        o["finish_reason"] for o in single["options"]
    ]

    digests, stats = result["digests"], result["stats"]
    if layout.startswith("tensor"):
        # Every rank samples: each must hand on bit-identical logits at every step, both
        # after our processors that run before temperature and after min-p.
        assert sorted(digests) == ["dp0-pp0-tp0", "dp0-pp0-tp1"]
        for stage in ("before_temperature", "after_min_p"):
            ranks = [digests[w][stage]["sha"] for w in sorted(digests)]
            assert len(ranks[0]) > 0 and ranks[0] == ranks[1], stage
        # Admission compiled the two grammars; every rank loaded them, none compiled.
        for s in stats.values():
            assert s["compile_cache"]["entries"] == 2, stats
            assert (s["compile_cache"]["compiled"], s["compile_cache"]["loaded"]) == (0, 2)
    elif layout.startswith("pipeline"):
        # Only the last stage samples; the first holds no requests and compiles nothing.
        assert sorted(digests) == ["dp0-pp1-tp0"]
        first = stats["dp0-pp0-tp0"]
        assert first["compile_cache"]["entries"] == 0
        assert all(p["payloads"] == 0 for p in first["processors"].values())
        last = stats["dp0-pp1-tp0"]["compile_cache"]
        assert (last["entries"], last["compiled"], last["loaded"]) == (2, 0, 2)
    else:
        # Two independent engines behind one API server; the requests are spread over both.
        # (vLLM reconfigures a dense model's engine 0 as a lone engine: its tag is empty.)
        assert sorted(digests) == ["dp1-pp0-tp0", "single"]
        assert all(len(d["before_temperature"]["sha"]) > 0 for d in digests.values())
