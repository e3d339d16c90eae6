"""(d) of ``make gpu-check``: where a step's GPU time goes, per configuration (issue #28).

Runs inside ``benchmarks/gpu_check.py``'s child process (the kit's ``cuda_harness`` already
pointed at our harness). Reuses the kit's ``bench.py`` set-up (requests admitted, prefilled and
decoded five steps through vLLM's real V2 sampler) but, instead of timing, runs
``Sampler.apply_sampling_params`` five times under ``torch.profiler`` and writes, per
configuration, the kernels per step and each kernel's device time per step (CPU ops on the dry
run). The counts say what a fused path saved; the times say which kernel to attack next.

    python -m benchmarks.gpu_check --only-steps d      (or as part of make gpu-check)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench  # the kit's bench.py (on sys.path: gpu_check puts the kit there)
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import gpu_bench  # noqa: F401  (adds XTC, no-repeat-ngram, xgrammar to bench)

STEPS = 5
CONFIGS = ("none", "pen_bias_minp", "vllm_builtin_pen_bias_minp", "typical_p", "top_n_sigma",
           "dry", "xtc", "no_repeat_ngram", "json_schema_llguidance", "json_noclose",
           "json_schema_xgrammar")  # fmt: skip


def profiled(table: dict, name: str):
    """A replacement for ``bench.timed``: warm up, then profile ``STEPS`` calls."""

    def timed(fn, iters: int, warmup: int) -> list[float]:
        cuda = bench.DEVICE == "cuda"

        def events():
            if not cuda:
                return None, None
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        for _ in range(2):
            fn(*events())
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            ms = [fn(*events()) for _ in range(STEPS)]
        kernels = []
        for e in prof.key_averages():
            device_us = getattr(e, "self_device_time_total", 0) or 0
            if cuda and device_us <= 0:
                continue
            if not cuda and not e.key.startswith("aten::"):
                continue
            kernels.append({"name": e.key[:90], "per_step": e.count / STEPS,
                            "us_per_step": round(device_us / STEPS, 2)})  # fmt: skip
        kernels.sort(key=lambda k: (-k["us_per_step"], -k["per_step"]))
        table[name] = {
            "kernels_per_step": round(sum(k["per_step"] for k in kernels), 1),
            "device_us_per_step": round(sum(k["us_per_step"] for k in kernels), 1),
            "ms_per_step_profiled": ms,
            "top": kernels[:14],
        }
        return ms

    return timed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--points", default="151936x64,248320x256")
    p.add_argument("--only", default=",".join(CONFIGS))
    a = p.parse_args(argv)
    from constrained.tiny_model import build_tiny_model

    only = a.only.split(",")
    out: dict = {"device": bench.DEVICE, "points": {}}
    for point in a.points.split(","):
        vocab, batch = (int(x) for x in point.split("x"))
        if bench.DRY:
            batch = min(batch, 2)
        model = str(build_tiny_model(bench.VOCABS[vocab]))
        cfg = bench.vllm_config(model, batch, batch * bench.PROMPT_LEN)
        tokens = batch * bench.PROMPT_LEN
        runner = bench.V2Runner(cfg, max_num_reqs=batch, vocab_size=vocab, num_spec=0,
                                max_model_len=512, max_num_batched_tokens=tokens)  # fmt: skip
        for proc in runner.custom:  # as bench.py: no sync guard around our apply
            for method in ("apply", "apply_staged_writes"):
                if method in vars(proc):
                    delattr(proc, method)
        table: dict = {}
        next_id = [0]
        for name, params in bench.configs().items():
            if name not in only:
                continue
            bench.timed = profiled(table, name)
            try:
                bench.bench_point(cfg, vocab, batch, name, params, runner, 1, 1, next_id)
            except Exception as exc:  # one configuration's failure is reported, the rest run
                table[name] = {"error": f"{type(exc).__name__}: {exc}"}
            row = table[name]
            print(f"[d] V={vocab} B={batch} {name:28s} kernels/step {row.get('kernels_per_step')}"
                  f" device us/step {row.get('device_us_per_step')}", flush=True)  # fmt: skip
            for k in row.get("top", [])[:6]:
                print(f"[d]     {k['per_step']:5.1f}x {k['us_per_step']:9.1f} us  {k['name']}")
        out["points"][point] = table
        Path(a.json).write_text(json.dumps(out, indent=1))
        del runner
        if bench.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
