"""Cost of each new sampler (DRY, XTC, top-n-sigma, typical-p, no-repeat-ngram).

Two parts, one process, run one after the other (never at the same time):

1. ``step``: the sampler's processor alone (no engine) on a simulated Model Runner V1 batch
   of B decoding requests at the tiny model's logits width (151,936): each step every output
   list grows by one random token and fresh logits are cloned (untimed), then
   ``update_state(None)`` + ``apply(logits)`` is timed. Median ms per step, per B.
2. ``e2e``: one real engine (CPU build, tiny Qwen2 model, our processors registered), B prompts
   x ``--tokens`` tokens (``ignore_eos``), temperature 1 and a seed per request, for ``none``
   (no options), each sampler alone, all of them together, and vLLM's own ``top_p=0.9`` for
   scale; configurations interleaved, the median of ``--repeats`` kept. Reported as output
   tokens/s and the ratio to ``none``.

Writes ``samplers.json`` and ``samplers.png`` under ``--out``.

Usage::

    python -m benchmarks.samplers                                   # full run, ~10 minutes
    python -m benchmarks.samplers --batches 8 --e2e-batches 8 --tokens 16 --steps 5   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.common import int_list, machine_info, median, str_list

# Each sampler's options, at values people use (llama.cpp's defaults where it has them).
SAMPLERS: dict[str, dict[str, Any]] = {
    "top_n_sigma": {"top_n_sigma": 1.0},
    "typical_p": {"typical_p": 0.9},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
}
OPTIONAL_SAMPLERS: dict[str, tuple[str, dict[str, Any]]] = {
    # processor module -> options; measured when the processor is registered
    "dry": (
        "constrained.processors.dry:DryProcessor",
        {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
         "dry_penalty_last_n": 1024},
    ),
    "no_repeat_ngram": (
        "constrained.processors.no_repeat_ngram:NoRepeatNGramProcessor",
        {"no_repeat_ngram_size": 3, "ngram_window": 1024},
    ),
}  # fmt: skip
# vLLM's own truncation sampler at the same point, for scale (a SamplingParams field).
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {"vllm_top_p": {"top_p": 0.9}}
VOCAB = 151_936
PROMPT_LEN = 32


def samplers() -> dict[str, dict[str, Any]]:
    """The samplers to measure: the three always there, DRY and n-gram once registered."""
    import constrained

    found = dict(SAMPLERS)
    for name, (spec, options) in OPTIONAL_SAMPLERS.items():
        if spec in constrained.LOGITS_PROCESSORS:
            found[name] = options
    return found


def owner_class(options: dict[str, Any]) -> type:
    """The registered processor class that applies these options."""
    import importlib

    import constrained

    for spec in constrained.LOGITS_PROCESSORS:
        module, _, name = spec.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if next(iter(options)) in cls.OPTIONS:
            return cls
    raise KeyError(options)


# ---- 1. per-step cost ---------------------------------------------------------------------


def step_cost(name: str, options: dict, batch: int, steps: int, rng: random.Random) -> dict:
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from constrained.tiny_model import build_tiny_model
    from tests.simulate import fake_vllm_config

    cls = owner_class(options)
    config = fake_vllm_config(batch, VOCAB)
    config.model_config.tokenizer = str(build_tiny_model())  # DRY's breakers need it
    config.model_config.max_model_len = 1024
    proc = cls(config, torch.device("cpu"), False)
    prompts = [[rng.randrange(VOCAB) for _ in range(PROMPT_LEN)] for _ in range(batch)]
    outputs = [[rng.randrange(VOCAB) for _ in range(64)] for _ in range(batch)]
    params = SamplingParams(temperature=1.0, seed=1, extra_args=options)
    added = [(i, params, prompts[i], outputs[i]) for i in range(batch)]
    proc.update_state(BatchUpdate(batch_size=batch, removed=[], added=added, moved=[]))
    base = torch.randn(batch, VOCAB) * 2
    times = []
    for step in range(steps + 2):
        for out in outputs:
            out.append(rng.randrange(VOCAB))
        logits = base.clone()
        start = time.perf_counter()
        proc.update_state(None)
        proc.apply(logits)
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
    return {"sampler": name, "batch": batch, "ms_median": 1e3 * median(times), "steps": steps}


# ---- 2. end to end ------------------------------------------------------------------------


def engine_throughput(configs: dict[str, dict], batches: list[int], tokens: int, repeats: int):
    from vllm import LLM, SamplingParams

    import constrained
    from benchmarks.e2e_sampling import engine_kwargs, make_prompts
    from constrained.tiny_model import build_tiny_model

    llm = LLM(
        model=str(build_tiny_model()),
        logits_processors=constrained.LOGITS_PROCESSORS,
        **engine_kwargs(),
    )

    def run(config: str, prompts: list[str], max_tokens: int) -> float:
        extra = configs[config] or None
        builtin = BUILTIN_CONFIGS.get(config, {})
        params = [
            SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=max_tokens,
                           ignore_eos=True, extra_args=extra, **builtin)
            for i in range(len(prompts))
        ]  # fmt: skip
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    rows = []
    for batch in batches:
        prompts = make_prompts(batch)
        seconds: dict[str, list[float]] = {c: [] for c in configs}
        for config in configs:
            run(config, prompts, 2)  # warm-up
        for _ in range(repeats):
            for config in configs:  # interleaved: machine noise spread over all of them
                seconds[config].append(run(config, prompts, tokens))
                print(f"batch {batch} {config}: {seconds[config][-1]:.2f} s", file=sys.stderr)
        none = median(seconds["none"])
        for config in configs:
            secs = median(seconds[config])
            rows.append(
                {
                    "batch": batch,
                    "config": config,
                    "tokens_per_s": batch * tokens / secs,
                    "ratio_to_none": none / secs,
                    "seconds_median": secs,
                    "repeats": repeats,
                }
            )
    llm.llm_engine.engine_core.shutdown()
    return rows


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for name in report["samplers"]:
        points = [p for p in report["step"] if p["sampler"] == name]
        left.plot([p["batch"] for p in points], [p["ms_median"] for p in points], "o-", label=name)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("batch (requests)")
    left.set_ylabel("ms per step (median)")
    left.set_title(f"processor alone, logits width {VOCAB:,}")
    left.legend(fontsize=8)
    batches = sorted({r["batch"] for r in report["e2e"]})
    configs = list(dict.fromkeys(r["config"] for r in report["e2e"]))
    width = 0.8 / max(len(configs), 1)
    for k, config in enumerate(configs):
        ys = [next(r["ratio_to_none"] for r in report["e2e"]
                   if r["batch"] == b and r["config"] == config) for b in batches]  # fmt: skip
        xs = [i + k * width for i in range(len(batches))]
        right.bar(xs, ys, width, label=config)
    right.axhline(0.9, color="red", linestyle="--", linewidth=1, label="-10%")
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(batches))],
                     [f"batch {b}" for b in batches])  # fmt: skip
    right.set_ylabel("throughput / no extras")
    right.set_ylim(0, max(1.2, 1.1 * max(r["ratio_to_none"] for r in report["e2e"])))
    right.set_title("end to end (real engine, tiny model)")
    right.legend(fontsize=7, ncol=2)
    machine = report["machine"]
    fig.suptitle(f"{machine['cpu_model']} x{machine['cpu_cores']}, vLLM {machine['vllm']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replot(path: str) -> None:
    """Redraw ``samplers.png`` from a ``samplers.json`` (``--replot PATH``)."""
    json_path = pathlib.Path(path)
    plot(json.loads(json_path.read_text()), json_path.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int_list, default=[1, 8, 64, 256])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per point")
    parser.add_argument("--e2e-batches", type=int_list, default=[64])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", type=str_list, default=None, help="samplers to measure")
    parser.add_argument(
        "--no-builtin",
        action="store_true",
        help="leave out vLLM's own top_p row (slow on CPU: a full sort)",
    )
    parser.add_argument("--out", default="benchmarks/results/samplers")
    parser.add_argument("--replot", metavar="JSON", help="only redraw the plot of a result")
    args = parser.parse_args(argv)
    if args.replot:
        replot(args.replot)
        return 0
    chosen = {k: v for k, v in samplers().items() if not args.only or k in args.only}
    rng = random.Random(0)
    step = [
        step_cost(name, options, batch, args.steps, rng)
        for name, options in chosen.items()
        for batch in args.batches
    ]
    for point in step:
        print(f"step {point['sampler']:16s} batch {point['batch']:4d}: "
              f"{point['ms_median']:8.2f} ms", file=sys.stderr)  # fmt: skip
    everything = {k: v for options in chosen.values() for k, v in options.items()}
    configs = {"none": {}, **chosen}
    if len(chosen) > 1:
        configs["all"] = everything
    if not args.no_builtin:
        configs["vllm_top_p"] = {}
    e2e = engine_throughput(configs, args.e2e_batches, args.tokens, args.repeats)
    report = {
        "benchmark": "samplers",
        "command": "python -m benchmarks.samplers " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "settings": vars(args),
        "samplers": chosen,
        "step": step,
        "e2e": e2e,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "samplers.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "samplers.png")
    print(json.dumps(e2e, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
