"""What our processors cost on each worker of a parallel engine (issue #17).

For each layout (one worker; tensor parallel 2; pipeline parallel 2; two data-parallel
engines behind one server) it runs ``tests/parallel_run.py``: a mixed batch of our options
(JSON schema, regex, windowed penalties, bias + min-p, DRY, no-repeat-ngram, XTC + top-n-sigma,
plain), then the same batch without options, in one engine, after an untimed warm-up run
with options (8 tokens: the constraints compile there). It reports, per worker:

* ``ms_per_step``: milliseconds our processors that run before temperature (all but min-p)
  took per decoding step of the run with options, measured inside the worker between a
  clock processor registered before ours and a digest processor registered after them;
* ``rss_mb`` and ``compile_cache_entries`` from the worker's state snapshot;

and per layout the output throughput with and without options (their ratio is the end-to-end
cost). Results: ``<out>/parallel.json`` and ``parallel.png``.

    .venv/bin/python -m benchmarks.parallel                 # all four layouts

Keep ``--copies`` at 2 or less with the default engine settings: 16 prompts of ~100 tokens per
copy must fit one step's token budget (4,096), because vLLM's CPU build kills the engine when
a seeded request's prefill is split over steps ("CPU Generator does not use offset").
    .venv/bin/python -m benchmarks.parallel --layouts single,tp2 --copies 1   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks.common import machine_info, median, percentile, str_list

LAYOUTS: dict[str, list[str]] = {
    "single": [],
    "tp2": ["--tp", "2"],
    "pp2": ["--pp", "2", "--compiled"],
    "served_dp2": ["--serve-dp", "2"],
}


def run_layout(model: str, args: list[str], copies: int, kv_blocks: int) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))[:2]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="|".join(map(str, cores)),
               PARALLEL_DIGEST_HASH="0")  # fmt: skip
    for key in ("PARALLEL_DIGEST_DIR", "CONSTRAINED_STATS_PATH"):
        env.pop(key, None)
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "tests.parallel_run", model, *args, "--warmup",
               "--copies", str(copies), "--kv-blocks", str(kv_blocks),
               "--out", str(out)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    workers = {}
    for worker, stages in result["digests"].items():
        stage = stages["before_temperature"]
        ms = [m for m, run in zip(stage["ms"], stage["run"], strict=True) if run == "options"]
        workers[worker] = {
            "steps": len(ms),
            "ms_per_step_mean": round(sum(ms) / len(ms), 3),
            "ms_per_step_median": round(median(ms), 3),
            "ms_per_step_p90": round(percentile(ms, 90), 3),
            "ms_total": round(sum(ms), 1),
        }
    for worker, snap in result["stats"].items():
        entry = workers.setdefault(worker, {"steps": 0})
        entry["rss_mb"] = snap["rss_mb"]
        entry["compile_cache_entries"] = snap["compile_cache"]["entries"]

    def per_label(label: str) -> dict[str, float]:
        tokens = sum(len(o["token_ids"]) for o in result[label])
        seconds, steps = result[f"{label}_seconds"], result[f"{label}_steps"]
        return {"seconds": round(seconds, 2), "tokens": tokens, "steps": steps,
                "tokens_per_s": round(tokens / seconds, 1),
                "ms_per_step": round(1e3 * seconds / max(steps, 1), 2)}  # fmt: skip

    with_options, plain = per_label("options"), per_label("plain")
    return {
        "workers": workers,
        "options": with_options,
        "plain": plain,
        "step_time_ratio": round(with_options["ms_per_step"] / plain["ms_per_step"], 3),
        "throughput_ratio": round(with_options["tokens_per_s"] / plain["tokens_per_s"], 3),
        "preemptions": result["preemptions"],
    }


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = [], []
    for layout, entry in report["layouts"].items():
        for worker, w in sorted(entry["workers"].items()):
            labels.append(f"{layout}\n{worker}")
            values.append(w.get("ms_per_step_mean", 0.0))
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 1.1), 4))
    ax.bar(range(len(labels)), values, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("our processors, ms per step (mean)")
    ax.set_title("Per-worker cost of our processors (0 = the worker never samples)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded tiny model")
    parser.add_argument("--layouts", type=str_list, default=list(LAYOUTS))
    parser.add_argument("--copies", type=int, default=2, help="the 16-request batch, n times")
    parser.add_argument("--kv-blocks", type=int, default=200, help="KV cache blocks per engine")
    parser.add_argument("--out", default="benchmarks/results/parallel")
    args = parser.parse_args()
    if args.model is None:
        from constrained.tiny_model import build_tiny_model

        args.model = str(build_tiny_model())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine_info(), "copies": args.copies, "layouts": {}}
    for layout in args.layouts:
        print(f"== {layout}", file=sys.stderr)
        result = run_layout(args.model, LAYOUTS[layout], args.copies, args.kv_blocks)
        report["layouts"][layout] = summarize(result)
        print(json.dumps(report["layouts"][layout], indent=1), file=sys.stderr)
    (out / "parallel.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "parallel.png")
    print(f"wrote {out / 'parallel.json'} and {out / 'parallel.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
