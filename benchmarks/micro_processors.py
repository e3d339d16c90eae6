"""Per-step cost of our logits processors alone (no engine), next to vLLM's own path.

For each logits width and batch size B, builds every class in ``constrained.LOGITS_PROCESSORS``
with a fake V1 config, adds B requests carrying the benchmark's option values (penalties,
``min_p``, 10-token ``logit_bias``) through one ``BatchUpdate``, then decodes: each step every
request's output list grows by one random token and fresh logits are cloned (both untimed),
and ``update_state(None)`` + ``apply(logits)`` of every processor is timed, in the order the
V1 sampler runs them (argmax-changing processors first, then min-p).

vLLM's path on the same logits, for comparison: its built-in ``LogitBiasLogitsProcessor``,
then ``apply_all_penalties`` (what the V1 sampler calls), then ``MinPLogitsProcessor``.

Reported per point: time per step (median, p90, per component), effective memory bandwidth
``2 * B * V * 4 bytes / median`` (logits read and written once), and the bytes of tensor state
each implementation holds. Writes ``micro_processors.json`` and ``.png`` under ``--out``.

Usage::

    python -m benchmarks.micro_processors                 # full run, a few minutes
    python -m benchmarks.micro_processors --batches 8 --widths qwen2 --steps 8   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pathlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from benchmarks.common import (
    PENALTIES,
    WIDTHS,
    int_list,
    machine_info,
    median,
    ours_extra_args,
    percentile,
    str_list,
    vllm_builtin_kwargs,
)
from tests.simulate import fake_vllm_config

CAPACITY = 256  # the e2e engine's max_num_seqs: our tables are sized by it
PROMPT_LEN = 32
CPU = torch.device("cpu")


def load_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# ---- state accounting ---------------------------------------------------------------------

_WALKED_MODULES = ("constrained", "vllm.v1.sample")


def state_bytes(*roots: Any) -> int:
    """Bytes of distinct tensor / ndarray storage reachable from ``roots``' attributes.

    Walks objects of our package and vLLM's sampling code, dicts, lists and tuples; shared
    storage (a host table mirrored as the "device" copy on CPU, a numpy view of a tensor) is
    counted once. Python ints in lists or dicts are not counted.
    """
    seen_objects: set[int] = set()
    seen_storage: set[int] = set()
    total = 0

    def add(ptr: int, nbytes: int) -> None:
        nonlocal total
        if nbytes and ptr not in seen_storage:
            seen_storage.add(ptr)
            total += nbytes

    def visit(obj: Any, depth: int) -> None:
        if depth > 8 or id(obj) in seen_objects:
            return
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            add(storage.data_ptr(), storage.nbytes())
        elif isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            add(base.__array_interface__["data"][0], base.nbytes)
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value, depth + 1)
        elif isinstance(obj, list | tuple | set | frozenset):
            for value in obj:
                if not isinstance(value, int | float):
                    visit(value, depth + 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(_WALKED_MODULES):
            visit(vars(obj), depth + 1)

    for root in roots:
        visit(root, 0)
    return total


# ---- the two pipelines --------------------------------------------------------------------


@dataclass
class Requests:
    """B decoding requests: prompts, and output lists the processors hold references to."""

    prompts: list[list[int]]
    outputs: list[list[int]]

    @classmethod
    def random(cls, batch: int, vocab: int, initial_output: int, rng: random.Random) -> Requests:
        def ids(n: int) -> list[int]:
            return [rng.randrange(vocab) for _ in range(n)]

        return cls(
            [ids(PROMPT_LEN) for _ in range(batch)], [ids(initial_output) for _ in range(batch)]
        )

    def batch_update(self, params: Any) -> Any:
        from vllm.v1.sample.logits_processor.interface import BatchUpdate

        added = [
            (i, params, p, o)
            for i, (p, o) in enumerate(zip(self.prompts, self.outputs, strict=True))
        ]
        return BatchUpdate(batch_size=len(self.prompts), removed=[], added=added, moved=[])

    def grow(self, vocab: int, rng: random.Random) -> None:
        for out in self.outputs:
            out.append(rng.randrange(vocab))


@dataclass
class Pipeline:
    """Named per-step components; each takes the logits and returns them (edited in place)."""

    name: str
    components: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]
    state: list[Any] = field(default_factory=list)


def _v1_step(proc: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(logits: torch.Tensor) -> torch.Tensor:
        proc.update_state(None)
        return proc.apply(logits)

    return step


def ours_pipeline(vocab: int, reqs: Requests) -> Pipeline:
    from vllm import SamplingParams

    import constrained

    cfg = fake_vllm_config(CAPACITY, vocab)
    # The sampling processors (the grammar mask has its own benchmark, e2e_structured).
    measured = [p for p in constrained.LOGITS_PROCESSORS if "grammar_mask" not in p]
    procs = [load_class(spec)(cfg, CPU, False) for spec in measured]
    # V1 sampler order: argmax-changing processors first, then argmax-invariant (min-p).
    procs.sort(key=lambda p: p.is_argmax_invariant())
    params = SamplingParams(temperature=1.0, extra_args=ours_extra_args())
    update = reqs.batch_update(params)
    for proc in procs:
        proc.update_state(update)
    return Pipeline("ours", [(type(p).__name__, _v1_step(p)) for p in procs], list(procs))


def vllm_pipeline(vocab: int, reqs: Requests) -> Pipeline:
    from vllm import SamplingParams
    from vllm.utils.torch_utils import make_tensor_with_pad
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
    )
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    cfg = fake_vllm_config(CAPACITY, vocab)
    bias = LogitBiasLogitsProcessor(cfg, CPU, False)
    min_p = MinPLogitsProcessor(cfg, CPU, False)
    params = SamplingParams(temperature=1.0, **vllm_builtin_kwargs())
    update = reqs.batch_update(params)
    bias.update_state(update)
    min_p.update_state(update)
    batch = len(reqs.prompts)
    # What the input batch keeps for the sampler (rebuilt only when the batch changes).
    meta = SimpleNamespace(
        prompt_token_ids=make_tensor_with_pad(reqs.prompts, pad=vocab, dtype=torch.int64),
        presence=torch.full((batch,), PENALTIES["presence_penalty"]),
        frequency=torch.full((batch,), PENALTIES["frequency_penalty"]),
        repetition=torch.full((batch,), PENALTIES["repetition_penalty"]),
    )

    def penalties(logits: torch.Tensor) -> torch.Tensor:
        return apply_all_penalties(
            logits,
            meta.prompt_token_ids,
            meta.presence,
            meta.frequency,
            meta.repetition,
            reqs.outputs,
        )

    components = [
        ("LogitBiasLogitsProcessor", _v1_step(bias)),
        ("apply_all_penalties", penalties),
        ("MinPLogitsProcessor", _v1_step(min_p)),
    ]
    return Pipeline("vllm", components, [bias, min_p, vars(meta)])


# ---- measurement --------------------------------------------------------------------------


def build(impl: str, vocab: int, reqs: Requests) -> Pipeline:
    if impl == "ours":
        return ours_pipeline(vocab, reqs)
    return vllm_pipeline(vocab, reqs)


def measure(
    impl: str,
    base_logits: torch.Tensor,
    reqs: Requests,
    args: argparse.Namespace,
    rng: random.Random,
) -> tuple[Pipeline, list[dict[str, float]]]:
    """Run warm-up then timed steps; per step, the seconds of each component."""
    vocab = base_logits.shape[1]
    pipe = build(impl, vocab, reqs)
    per_step: list[dict[str, float]] = []
    spent = 0.0
    for step in range(args.warmup + args.steps):
        reqs.grow(vocab, rng)
        logits = base_logits.clone()
        times: dict[str, float] = {}
        for name, fn in pipe.components:
            start = time.perf_counter()
            logits = fn(logits)
            times[name] = time.perf_counter() - start
        if step >= args.warmup:
            per_step.append(times)
            spent += sum(times.values())
            if spent > args.max_seconds and len(per_step) >= args.min_steps:
                break
    return pipe, per_step


def run_step(pipe: Pipeline, logits: torch.Tensor) -> torch.Tensor:
    for _, fn in pipe.components:
        logits = fn(logits)
    return logits


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def transient_memory(pipe: Pipeline, base_logits: torch.Tensor, reqs: Requests) -> dict[str, int]:
    """Bytes one step allocates (sum) and its peak above the start (torch profiler, CPU).

    Approximate: an op's allocations and frees are netted at the op's start, so temporaries
    freed inside a single op are missed. The logits themselves are edited in place.
    """
    from torch.profiler import ProfilerActivity, profile

    reqs.grow(base_logits.shape[1], random.Random(0))
    logits = base_logits.clone()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step(pipe, logits)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    running = peak = allocated = 0
    for event in events:
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
        allocated += max(event.self_cpu_memory_usage, 0)
    return {"step_allocated_bytes": allocated, "step_peak_bytes": peak}


def summarize(
    pipe: Pipeline, per_step: list[dict[str, float]], batch: int, vocab: int
) -> dict[str, Any]:
    totals = [sum(t.values()) for t in per_step]
    med = median(totals)
    logits_bytes = 2 * batch * vocab * 4
    held = state_bytes(*pipe.state)
    record: dict[str, Any] = {
        "impl": pipe.name,
        "vocab": vocab,
        "batch": batch,
        "steps": len(per_step),
        "median_ms": med * 1e3,
        "p90_ms": percentile(totals, 90) * 1e3,
        "min_ms": min(totals) * 1e3,
        "per_row_us": med * 1e6 / batch,
        "bandwidth_gb_s": logits_bytes / med / 1e9,
        "components": {
            name: {
                "median_ms": median([t[name] for t in per_step]) * 1e3,
                "p90_ms": percentile([t[name] for t in per_step], 90) * 1e3,
            }
            for name, _ in pipe.components
        },
        "state_bytes": held,
        "state_bytes_per_capacity_entry": held / (CAPACITY * vocab),
        "state_bytes_per_active_entry": held / (batch * vocab),
    }
    if pipe.name == "vllm":
        subset = [t["LogitBiasLogitsProcessor"] + t["MinPLogitsProcessor"] for t in per_step]
        record["median_ms_bias_min_p_only"] = median(subset) * 1e3
    return record


def agreement(
    vocab: int, batch: int, base_logits: torch.Tensor, args: argparse.Namespace, steps: int = 4
) -> dict[str, float]:
    """Both pipelines on the same requests for a few decoding steps: worst share of identical
    -inf masks, largest finite diff."""
    rng = random.Random(batch)
    reqs = Requests.random(batch, vocab, args.initial_output, rng)
    ours, vllm = ours_pipeline(vocab, reqs), vllm_pipeline(vocab, reqs)
    worst: dict[str, float] = {"same_mask_fraction": 1.0, "rows_with_same_mask": 1.0}
    diff = kept = 0.0
    for _ in range(steps):
        reqs.grow(vocab, rng)
        a = run_step(ours, base_logits.clone())
        b = run_step(vllm, base_logits.clone())
        mask_a, mask_b = torch.isinf(a), torch.isinf(b)
        both = ~mask_a & ~mask_b
        if bool(both.any()):
            diff = max(diff, (a[both] - b[both]).abs().max().item())
        same = mask_a == mask_b
        worst["same_mask_fraction"] = min(worst["same_mask_fraction"], same.float().mean().item())
        worst["rows_with_same_mask"] = min(
            worst["rows_with_same_mask"], same.all(dim=1).float().mean().item()
        )
        kept = (~mask_a).sum(dim=1).float().mean().item()
    return worst | {"steps": steps, "max_abs_diff_finite": diff, "kept_per_row_ours": kept}


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    for width in args.widths:
        vocab = WIDTHS[width]
        for batch in args.batches:
            gen = torch.Generator().manual_seed(batch)
            base = torch.randn(batch, vocab, generator=gen).mul_(2.0)
            for impl in ("ours", "vllm"):
                rng = random.Random(batch)  # same prompts and outputs for both
                reqs = Requests.random(batch, vocab, args.initial_output, rng)
                pipe, per_step = measure(impl, base, reqs, args, rng)
                record = summarize(pipe, per_step, batch, vocab) | {"width": width}
                record |= transient_memory(pipe, base, reqs)
                results.append(record)
                print(
                    f"{width:8s} B={batch:4d} {impl:5s}: median {record['median_ms']:8.3f} ms"
                    f"  p90 {record['p90_ms']:8.3f} ms  {record['bandwidth_gb_s']:6.2f} GB/s"
                    f"  state {record['state_bytes'] / 2**20:7.2f} MiB"
                    f"  step peak {record['step_peak_bytes'] / 2**20:8.2f} MiB"
                    f" ({record['steps']} steps)",
                    flush=True,
                )
            check = agreement(vocab, batch, base, args)
            checks.append({"width": width, "vocab": vocab, "batch": batch} | check)
    return {
        "benchmark": "micro_processors",
        "machine": machine_info(),
        "settings": {
            "widths": args.widths,
            "batches": args.batches,
            "steps": args.steps,
            "warmup": args.warmup,
            "min_steps": args.min_steps,
            "max_seconds": args.max_seconds,
            "initial_output": args.initial_output,
            "threads": torch.get_num_threads(),
            "prompt_len": PROMPT_LEN,
            "capacity": CAPACITY,
            "logits": "randn * 2, float32, cloned fresh every step (untimed)",
            "options": {
                "vllm": vllm_builtin_kwargs(),
                "ours": ours_extra_args(),
            },
        },
        "results": results,
        "agreement": checks,
    }


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = report["settings"]["widths"]
    fig, axes = plt.subplots(2, len(widths), figsize=(6 * len(widths), 8), squeeze=False)
    styles = {"ours": ("#ff7f0e", "-"), "vllm": ("#1f77b4", "-")}
    for col, width in enumerate(widths):
        rows = [r for r in report["results"] if r["width"] == width]
        for impl, (color, ls) in styles.items():
            pts = sorted((r["batch"], r) for r in rows if r["impl"] == impl)
            xs = [b for b, _ in pts]
            axes[0][col].plot(
                xs, [r["median_ms"] for _, r in pts], ls, marker="o", color=color, label=impl
            )
            axes[0][col].fill_between(
                xs,
                [r["median_ms"] for _, r in pts],
                [r["p90_ms"] for _, r in pts],
                color=color,
                alpha=0.2,
            )
            axes[1][col].plot(
                xs, [r["bandwidth_gb_s"] for _, r in pts], ls, marker="o", color=color, label=impl
            )
            if impl == "vllm":
                axes[0][col].plot(
                    xs,
                    [r["median_ms_bias_min_p_only"] for _, r in pts],
                    "--",
                    marker=".",
                    color=color,
                    label="vllm bias + min_p only",
                )
        vocab = rows[0]["vocab"] if rows else WIDTHS[width]
        axes[0][col].set_title(f"{width}: vocab {vocab:,}")
        axes[0][col].set_ylabel("ms per step (median, shade to p90)")
        axes[1][col].set_ylabel("effective bandwidth GB/s (2·B·V·4 / median)")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size B")
            ax.legend(fontsize=8)
        axes[0][col].set_yscale("log")
    m = report["machine"]
    fig.suptitle(
        f"logits processors per decoding step, {m['cpu_model']} x{m['cpu_cores']}, "
        f"torch {m['torch']}, {report['settings']['threads']} thread(s), "
        "ours all five options",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=str_list, default=list(WIDTHS), help="qwen2,qwen3.6")
    parser.add_argument("--batches", type=int_list, default=[1, 8, 64, 256], help="1,8,64,256")
    parser.add_argument("--steps", type=int, default=64, help="timed steps per point (max)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--min-steps", type=int, default=10, help="timed steps at least")
    parser.add_argument(
        "--max-seconds", type=float, default=10.0, help="stop a point after this much timed work"
    )
    parser.add_argument("--initial-output", type=int, default=32, help="output tokens at start")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    parser.add_argument("--out", default="benchmarks/results", help="results directory")
    args = parser.parse_args(argv)
    unknown = [w for w in args.widths if w not in WIDTHS]
    if unknown:
        parser.error(f"unknown width(s) {unknown}; choose from {sorted(WIDTHS)}")
    if max(args.batches) > CAPACITY:
        parser.error(f"batch sizes must be <= {CAPACITY}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "micro_processors.json", out / "micro_processors.png"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, png_path)
    for c in report["agreement"]:
        print(
            f"{c['width']:8s} B={c['batch']:4d}: same -inf mask {c['same_mask_fraction']:.6f}, "
            f"max |diff| {c['max_abs_diff_finite']:.3g}, kept/row {c['kept_per_row_ours']:.0f}"
        )
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
