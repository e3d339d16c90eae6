"""Kernel launches and host syncs per decoding step, per processor configuration (issue #28).

Counted on CPU by ``tests/v2_real/launch_counts.py`` on vLLM's real Model Runner V2 sampler
(one subprocess, ~30 s): every computing ATen op and every Triton launch inside our
processors' ``apply`` during a steady decode step, and the sync guard's host fetches. On a GPU
each is a launch (or a sync), and at decoding batch sizes launches, not bytes, set the time:
a change that adds a pass or a sync fails here without a GPU. Counts, never times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Our launches per step (all our processors together), at most. vLLM's own built-in
# penalties + logit_bias + min_p take 3 (one Triton kernel each); ours match that.
BUDGET: dict[str, int] = {
    "none": 0,
    "logit_bias": 1,  # the prep kernel (atomic adds)
    "penalties": 2,  # prep (count the new tokens) + penalties
    "penalties_window": 2,
    "min_p": 2,  # block maxima + mask
    "pen_bias_minp": 3,  # prep + penalties with block maxima + mask
    "pen_bias_minp_dry": 4 + 2,  # DRY between: min-p runs on its own (2 launches)
    "dry": 2,  # repeat lengths and candidates, then their atomic min (dry_kernel.py)
    "no_repeat_ngram": 1,  # one Triton program per row (ngram_kernel.py)
    "top_n_sigma": 5,  # 3 Triton launches for the bound (truncation_kernels.py), 1 mask
    "typical_p": 9,  # 7 Triton launches for the bounds, 6 reading the logits (were 9 and 8
    # before #57's path histogram: truncation_kernels.py), 1 mask, 1 gather of typical_p
    "xtc": 4,  # 4 Triton passes: draw + top, sum, least qualifying, mask (truncation_kernels.py)
}
# vLLM's built-ins for the same options, for the record (asserted so the comparison holds).
VLLM_BUILTIN = {"vllm_builtin_pen_bias_minp": 3}


@pytest.fixture(scope="module")
def launch_counts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of ``tests/v2_real/launch_counts.py`` for both tests below: its directory
    holds the counts (``counts.json``) and the kernel variants it launched (``variants.json``)."""
    tmp_path = tmp_path_factory.mktemp("launch_counts")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.v2_real.launch_counts", "--json",
         str(tmp_path / "counts.json"), "--variants", str(tmp_path / "variants.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp_path


def test_launches_and_syncs_per_step(launch_counts: Path) -> None:
    out = launch_counts / "counts.json"
    results = json.loads(out.read_text())["results"]
    assert set(BUDGET) | set(VLLM_BUILTIN) <= set(results)
    over = {
        name: (results[name]["ours"], budget)
        for name, budget in BUDGET.items()
        if results[name]["ours"] > budget
    }
    assert not over, f"more launches per step than budgeted (got, budget): {over}"
    for name, count in VLLM_BUILTIN.items():
        launches = results[name]["launches"]
        vllm = sum(v for k, v in launches.items() if k.startswith("vllm:"))
        assert vllm == count, (name, launches)
        assert results[name]["ours"] == 0
    syncs = {name: r["syncs"] for name, r in results.items() if r["syncs"]}
    assert not syncs, f"host syncs in a step: {syncs}"


# Every Triton kernel of ours; each must have been launched in some configuration above.
OUR_KERNELS = {
    "_prep_kernel", "_penalties_max_kernel", "_min_p_mask_kernel", "_typical_pass_kernel",
    "_top_n_sigma_pass_kernel", "_mask_outside_kernel",
    "_dry_repeats_kernel", "_dry_min_kernel",
    "_no_repeat_ngram_kernel", "_xtc_pass_kernel",
}  # fmt: skip


def test_every_kernel_variant_compiles_for_the_gpu(launch_counts: Path) -> None:
    """Each variant of our kernels that the launch counts ran in Triton's interpreter (its
    argument types and constexprs) compiles for sm_90 with Triton's NVIDIA backend, no GPU
    needed: the interpreter forgave two compile errors that first showed on an H200 (#28)."""
    variants = launch_counts / "variants.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert {v["name"] for v in json.loads(variants.read_text())} >= OUR_KERNELS
    proc = subprocess.run(
        [sys.executable, "-m", "tests.v2_real.cuda_compile", str(variants)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CUDACOMPILE ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = {k: v for k, v in json.loads(line[len("CUDACOMPILE ") :]).items() if v != "ok"}
    assert not failed, failed
    assert proc.returncode == 0
