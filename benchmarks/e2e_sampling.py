"""End-to-end decoding throughput: no extras vs vLLM's built-in options vs ours.

For each logits width (one tiny model per width) a child process starts ONE engine with our
processors registered and, for each batch size, times three configurations in turn:

- ``none``: temperature 1.0 and a seed per request, nothing else;
- ``vllm``: vLLM's built-in ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``,
  ``min_p`` and ``logit_bias`` (10 token ids);
- ``ours``: the same values through ``extra_args`` (our processors).

A batch of B means B prompts in one ``llm.generate`` call, each generating exactly
``--tokens`` tokens (``ignore_eos``). The parent process runs one child per width and writes
``e2e_sampling.json`` and ``e2e_sampling.png`` under ``--out``.

Usage::

    python -m benchmarks.e2e_sampling                       # full run (slow: minutes per width)
    python -m benchmarks.e2e_sampling --widths qwen2 --batches 8 --tokens 16   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import (
    WIDTHS,
    int_list,
    machine_info,
    median,
    ours_extra_args,
    str_list,
    vllm_builtin_kwargs,
)

CONFIGS = ("none", "vllm", "ours")
MAX_NUM_SEQS = 256
SEED_BASE = 1000
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

_OPENERS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "In a recent study, researchers found that",
    "Dear customer, thank you for",
    "SELECT name FROM users WHERE",
    "The recipe calls for two cups of",
    "Breaking news:",
    "import numpy as np\n",
    "The best way to learn a language is",
    "Q: What is the boiling point of water?\nA:",
    "Il était une fois",
    "The three laws of motion are",
)


def make_prompts(count: int) -> list[str]:
    """``count`` short, distinct prompts (opener plus a varying tail)."""
    return [f"{_OPENERS[i % len(_OPENERS)]} (#{i} of {count})" for i in range(count)]


def engine_kwargs() -> dict[str, Any]:
    return {
        "dtype": "float32",
        "enforce_eager": True,
        "generation_config": "vllm",
        "max_model_len": 1024,
        "max_num_seqs": MAX_NUM_SEQS,
        "seed": 0,
    }


# ---- child: one engine, one width ---------------------------------------------------------


def _params(config: str, index: int, max_tokens: int, detokenize: bool) -> Any:
    from vllm import SamplingParams

    common = {
        "temperature": 1.0,
        "seed": SEED_BASE + index,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "detokenize": detokenize,
    }
    if config == "vllm":
        return SamplingParams(**common, **vllm_builtin_kwargs())
    if config == "ours":
        return SamplingParams(**common, extra_args=ours_extra_args())
    return SamplingParams(**common)


def _time_generate(
    llm: Any, prompts: list[str], config: str, tokens: int, detokenize: bool
) -> tuple[float, list[list[int]]]:
    params = [_params(config, i, tokens, detokenize) for i in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, [list(out.outputs[0].token_ids) for out in outputs]


def _identical(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def run_child(
    width: str, batches: list[int], tokens: int, repeats: int, detokenize: bool
) -> dict[str, Any]:
    """Measure every (batch, config) on one engine; returns the width's JSON record."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vllm import LLM

    import constrained
    from constrained.tiny_model import build_tiny_model

    model = str(build_tiny_model(vocab=width))
    start = time.perf_counter()
    llm = LLM(model=model, logits_processors=constrained.LOGITS_PROCESSORS, **engine_kwargs())
    startup_s = time.perf_counter() - start
    logits_width = llm.llm_engine.model_config.get_vocab_size()

    measurements: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    agreement: list[dict[str, Any]] = []
    # Engine-wide warm-up: the largest batch once per configuration, a few tokens each.
    for config in CONFIGS:
        _time_generate(llm, make_prompts(max(batches)), config, 4, detokenize)
    for batch in batches:
        prompts = make_prompts(batch)
        seconds: dict[str, list[float]] = {c: [] for c in CONFIGS}
        produced: dict[str, int] = {}
        outputs: dict[str, list[list[int]]] = {}
        for repeat in range(repeats):
            for config in CONFIGS:  # interleaved, to spread machine noise over the three
                # warm-up at the same batch size, then the timed call
                _time_generate(llm, prompts, config, 2, detokenize)
                secs, ids = _time_generate(llm, prompts, config, tokens, detokenize)
                out_tokens = sum(len(x) for x in ids)
                seconds[config].append(secs)
                outputs.setdefault(config, ids)
                produced.setdefault(config, out_tokens)
                measurements.append(
                    {
                        "batch": batch,
                        "config": config,
                        "repeat": repeat,
                        "seconds": secs,
                        "output_tokens": out_tokens,
                        "tokens_per_s": out_tokens / secs,
                        "requests_per_s": batch / secs,
                    }
                )
                print(
                    f"[{width}] batch {batch:4d} {config:5s} repeat {repeat}: "
                    f"{out_tokens / secs:9.1f} tok/s  {batch / secs:7.2f} req/s  ({secs:.2f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        for config in CONFIGS:
            secs = median(seconds[config])
            summary.append(
                {
                    "batch": batch,
                    "config": config,
                    "repeats": repeats,
                    "seconds_median": secs,
                    "output_tokens": produced[config],
                    "tokens_per_s": produced[config] / secs,
                    "requests_per_s": batch / secs,
                }
            )
        agreement.append(
            {
                "batch": batch,
                "identical_vllm_vs_ours": _identical(outputs["vllm"], outputs["ours"]),
                "identical_none_vs_ours": _identical(outputs["none"], outputs["ours"]),
                "identical_none_vs_vllm": _identical(outputs["none"], outputs["vllm"]),
            }
        )
    return {
        "width": width,
        "logits_width": logits_width,
        "model": model,
        "detokenize": detokenize,
        "ours_extra_args": {str(k): v for k, v in ours_extra_args().items()},
        "engine_kwargs": engine_kwargs(),
        "startup_s": startup_s,
        "machine": machine_info(),
        "measurements": measurements,
        "summary": summary,
        "agreement": agreement,
        "ratios": _ratios(summary),
    }


def _ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key = {(s["batch"], s["config"]): s["tokens_per_s"] for s in summary}
    batches = sorted({s["batch"] for s in summary})
    return [
        {
            "batch": b,
            "ours_over_vllm": by_key[b, "ours"] / by_key[b, "vllm"],
            "ours_over_none": by_key[b, "ours"] / by_key[b, "none"],
            "vllm_over_none": by_key[b, "vllm"] / by_key[b, "none"],
        }
        for b in batches
    ]


# ---- parent: one child per width, then JSON and plot --------------------------------------


def _spawn_child(width: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="e2e_sampling-") as tmp:
        result = pathlib.Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.e2e_sampling",
            "--child",
            width,
            "--child-out",
            str(result),
            "--batches",
            ",".join(map(str, args.batches)),
            "--tokens",
            str(args.tokens),
            "--repeats",
            str(args.repeats),
            *(["--no-detokenize"] if args.no_detokenize else []),
        ]
        print(f"== {width}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False)
        if proc.returncode != 0 or not result.exists():
            return {"width": width, "error": f"child exited with status {proc.returncode}"}
        return json.loads(result.read_text())


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"].values() if "summary" in r]
    if not runs:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5), squeeze=False)
    colors = {"none": "#9e9e9e", "vllm": "#1f77b4", "ours": "#ff7f0e"}
    bar = 0.27
    for ax, run in zip(axes[0], runs, strict=True):
        batches = sorted({s["batch"] for s in run["summary"]})
        tps = {(s["batch"], s["config"]): s["tokens_per_s"] for s in run["summary"]}
        for k, config in enumerate(CONFIGS):
            xs = [i + (k - 1) * bar for i in range(len(batches))]
            ys = [tps[b, config] for b in batches]
            ax.bar(xs, ys, bar, label=config, color=colors[config])
            for x, y in zip(xs, ys, strict=True):
                ax.text(x, y, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
        top = max(tps.values())
        for i, r in enumerate(run["ratios"]):
            ax.text(
                i,
                top * 1.12,
                f"ours/vllm {r['ours_over_vllm']:.2f}\nours/none {r['ours_over_none']:.2f}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylim(0, top * 1.35)
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{run['width']}: logits width {run['logits_width']:,}")
        ax.legend(loc="upper left", fontsize=8)
    machine = report["machine"]
    fig.suptitle(
        f"e2e decoding throughput, {report['settings']['tokens']} tokens/request, "
        f"{machine['cpu_model']} x{machine['cpu_cores']}, vLLM {machine['vllm']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_parent(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "benchmark": "e2e_sampling",
        "machine": machine_info(),
        "settings": {
            "widths": args.widths,
            "batches": args.batches,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "detokenize": not args.no_detokenize,
            "configs": list(CONFIGS),
            "temperature": 1.0,
            "seed": f"{SEED_BASE} + request index",
            "options": {
                "vllm": vllm_builtin_kwargs(),
                "ours": ours_extra_args(),
            },
        },
        "runs": {},
    }
    for width in args.widths:
        report["runs"][width] = _spawn_child(width, args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "e2e_sampling.json", out / "e2e_sampling.png"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, png_path)
    for run in report["runs"].values():
        if "error" in run:
            print(f"{run['width']}: {run['error']}", file=sys.stderr)
            continue
        for r in run["ratios"]:
            print(
                f"{run['width']:8s} batch {r['batch']:4d}: ours/vllm {r['ours_over_vllm']:.3f}"
                f"  ours/none {r['ours_over_none']:.3f}  vllm/none {r['vllm_over_none']:.3f}"
            )
        for a in run["agreement"]:
            print(
                f"{run['width']:8s} batch {a['batch']:4d}: "
                f"identical vllm vs ours {a['identical_vllm_vs_ours']:.0%}"
            )
    print(f"wrote {json_path} and {png_path}")
    return 1 if any("error" in r for r in report["runs"].values()) else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=str_list, default=list(WIDTHS), help="qwen2,qwen3.6")
    parser.add_argument("--batches", type=int_list, default=[8, 64, 256], help="8,64,256")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--repeats", type=int, default=1, help="timings per point (median kept)")
    parser.add_argument(
        "--no-detokenize",
        action="store_true",
        help="SamplingParams(detokenize=False): leave text decoding out of the timing",
    )
    parser.add_argument("--out", default="benchmarks/results", help="results directory")
    parser.add_argument("--child", metavar="WIDTH", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [w for w in ([args.child] if args.child else args.widths) if w not in WIDTHS]
    if unknown:
        parser.error(f"unknown width(s) {unknown}; choose from {sorted(WIDTHS)}")
    if max(args.batches) > MAX_NUM_SEQS:
        parser.error(f"batch sizes must be <= max_num_seqs = {MAX_NUM_SEQS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        record = run_child(
            args.child, args.batches, args.tokens, args.repeats, not args.no_detokenize
        )
        pathlib.Path(args.child_out).write_text(json.dumps(record, indent=2) + "\n")
        return 0
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
