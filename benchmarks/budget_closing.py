"""Finishing by ``max_tokens``: MaskBench generation at small budgets, ours vs vLLM's built-in.

One engine (the embedded tiny Qwen2 model, random weights, ``constrained.demo.engine_kwargs()``,
our processors registered, vLLM's structured outputs at their defaults), ``--schemas``
MaskBench schemas drawn with a fixed seed across the splits, each request alone (so a
refusal is that request's), temperature 1.0, a seed per request, at each budget of
``--budgets``, in three configurations:

- ``ours``: ``extra_args={"json_schema": ...}`` (``close_at_max_tokens`` on, the default);
- ``ours_cut``: the same with ``close_at_max_tokens=False`` (how every output ended before);
- ``vllm``: vLLM's ``StructuredOutputsParams(json=...)``.

Each output is judged with ``tests/output_checks.check_output`` (the schema's own draft, with
its format checker): ``valid``, ``cut`` (``finish_reason == "length"``), ``invalid`` (finished
but not valid) or ``refused`` (an error at ``generate``; ours names ``max_tokens`` when the
budget is too small, or the schema keyword no backend enforces).

Cost, end to end: the admitted schemas of the middle budget as one batch, ``ours`` and ``ours_cut``
alternated over ``--rounds`` rounds; milliseconds per engine step (``ours`` ends requests
early, so its batch thins out: per step is the fair comparison) and output tokens per second
of each (medians). Cost, the processor alone: ``processor_cost`` (every row closing, every
step). Writes
``budget_closing.json`` and ``budget_closing.png`` under ``--out``.

Usage::

    python -m benchmarks.budget_closing                     # 60 schemas x (32, 64, 128)
    python -m benchmarks.budget_closing --schemas 6 --budgets 32 --rounds 1 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import time
from typing import Any

from benchmarks.common import int_list, machine_info
from benchmarks.structured.schemas import DEFAULT_MASKBENCH, load_schema, prompt_for

CONFIGS = ("ours", "ours_cut", "vllm")


def draw(maskbench: pathlib.Path, count: int, seed: int) -> list[str]:
    names = sorted(p.name for p in maskbench.glob("*.json"))
    return sorted(random.Random(seed).sample(names, count))


def params_for(config: str, schema: Any, budget: int, seed: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    base = dict(temperature=1.0, seed=seed, max_tokens=budget)
    if config == "vllm":
        return SamplingParams(**base, structured_outputs=StructuredOutputsParams(json=schema))
    extra: dict[str, Any] = {"json_schema": schema}
    if config == "ours_cut":
        extra["close_at_max_tokens"] = False
    return SamplingParams(**base, extra_args=extra)


def judge(llm: Any, config: str, name: str, schema: Any, budget: int, seed: int) -> dict:
    from tests.output_checks import check_output

    try:
        out = llm.generate(
            [prompt_for(name)], params_for(config, schema, budget, seed), use_tqdm=False
        )[0].outputs[0]
    except Exception as exc:
        message = str(exc)
        field = "max_tokens" if "'max_tokens'" in message else "schema"
        return {"outcome": "refused", "refused_for": field, "detail": message[:300]}
    if out.finish_reason == "length":
        return {"outcome": "cut", "tokens": len(out.token_ids)}
    status, detail = check_output(out.text, schema)
    outcome = "valid" if status == "valid" else "invalid"
    return {"outcome": outcome, "tokens": len(out.token_ids), "detail": detail}


def timed_batch(
    llm: Any, config: str, names: list[str], schemas: dict, budget: int, seed: int = 0
) -> dict:
    """One batch: milliseconds per engine step (wall time over the longest output's tokens,
    one token per step) and output tokens per second. ``ours`` ends requests early, so its
    batch thins out; ms/step is the fair per-step comparison. Request ``i`` samples with
    seed ``seed + i`` (each round its own: a round never replays an earlier one's outputs,
    whose near rows the grammar's store of checks would already hold)."""
    params = [params_for(config, schemas[n], budget, seed + i) for i, n in enumerate(names)]
    start = time.perf_counter()
    outs = llm.generate([prompt_for(n) for n in names], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    return {"ms_per_step": 1000 * seconds / max(lengths), "tokens_per_s": sum(lengths) / seconds}


def processor_cost(
    model_dir: pathlib.Path,
    names: list[str],
    schemas: dict,
    steps: int,
    rounds: int,
    budget: int | None = None,
) -> dict:
    """The grammar processor alone (no engine), driven as V1 drives it: one batch of
    ``len(names)`` requests at ``max_tokens = 2 * need + 32`` (``need`` its shortest
    witness), or ``budget`` for all, with closing on and off; a request that
    ends (end-of-sequence, or cut at ``max_tokens``) is replaced in its row by a fresh one
    of the same schema, so every step has a full batch. Timed: ``update_state`` + ``apply``
    per step (the mask fill included), random logits, tokens sampled from the masked row."""
    import torch
    from transformers import AutoConfig
    from vllm import SamplingParams

    from constrained.grammars import GrammarSpec, compile_now, load_vocab
    from constrained.grammars.closing import find_witness
    from constrained.grammars.closing_sorts import forget_shared_sorts
    from constrained.processors.grammar_mask import GrammarMaskProcessor
    from tests.simulate import fake_vllm_config

    width = AutoConfig.from_pretrained(model_dir).vocab_size
    vocab = load_vocab(str(model_dir), width)
    texts = {n: json.dumps(schemas[n]) for n in names}
    budgets = {}
    for n in names:
        witness = find_witness(
            compile_now(GrammarSpec("json_schema", texts[n]), vocab).matcher(), vocab, 256
        )
        budgets[n] = 2 * len(witness) + 32 if witness is not None else 64
        if budget is not None:  # one budget for all (those that fit it)
            budgets[n] = budget
    config = fake_vllm_config(len(names), width, model_dir)

    def params(name: str, closes: bool) -> Any:
        extra = {"json_schema": texts[name], "close_at_max_tokens": closes}
        return SamplingParams(temperature=1.0, max_tokens=budgets[name], extra_args=extra)

    def one(closes: bool, seed: int) -> dict:
        forget_shared_sorts()  # each round from a cold store: sharing within it only
        torch.manual_seed(seed)
        proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
        seconds, ended = drive(
            proc, names, lambda n: params(n, closes), budgets, width, vocab.eos_token_id, steps
        )
        return {"ms_per_step": 1000 * seconds / steps, "requests_ended": ended}

    runs: dict[str, list[dict]] = {"closing": [], "off": []}
    one(True, 0)  # warm-up: compiles, vocabulary tables
    for r in range(rounds):
        runs["closing"].append(one(True, r))
        runs["off"].append(one(False, r))
    medians = {c: statistics.median(x["ms_per_step"] for x in v) for c, v in runs.items()}
    return {
        "batch": len(names),
        "steps": steps,
        "budgets": budgets,
        "ms_per_step": medians,
        "ratio_closing_to_off": medians["closing"] / medians["off"],
        "rounds": runs,
    }


def drive(
    proc: Any,
    names: list[str],
    params: Any,
    budgets: dict[str, int],
    width: int,
    eos: int,
    steps: int,
    clock: Any = time.perf_counter,
) -> tuple[float, int]:
    """Drive a grammar processor as V1 does, one row per name, for ``steps`` steps: random
    logits, each row's token sampled from its masked row, a request that ends (``eos``, or
    cut at ``budgets[name]``) replaced in its row by a fresh one (``params(name)``). The
    ``clock`` seconds spent in ``update_state`` + ``apply``, and how many requests ended."""
    import torch
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    rows: list[tuple[str, list[int]]] = [(n, []) for n in names]
    added = [(i, params(n), [1, 2, 3], out) for i, (n, out) in enumerate(rows)]
    update: Any = BatchUpdate(batch_size=len(rows), removed=[], added=added, moved=[])
    seconds, ended = 0.0, 0
    for _ in range(steps):
        logits = torch.randn(len(rows), width)
        start = clock()
        proc.update_state(update)
        out = proc.apply(logits)
        seconds += clock() - start
        noise = -torch.log(-torch.log(torch.rand_like(out).clamp_min(1e-9)))
        tokens = (out + noise).argmax(dim=-1).tolist()
        added = []
        for i, ((name, output), token) in enumerate(zip(rows, tokens, strict=True)):
            output.append(token)
            if token == eos or len(output) >= budgets[name]:
                ended += 1
                rows[i] = (name, [])
                added.append((i, params(name), [1, 2, 3], rows[i][1]))
        update = BatchUpdate(batch_size=len(rows), removed=[], added=added, moved=[])
        update = update if added else None
    return seconds, ended


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = record["budgets"]
    fig, axes = plt.subplots(1, len(budgets), figsize=(4 * len(budgets), 3.6), sharey=True)
    axes = axes if len(budgets) > 1 else [axes]
    colours = {"valid": "#2a9d8f", "cut": "#e76f51", "invalid": "#9b2226", "refused": "#adb5bd"}
    for ax, budget in zip(axes, budgets, strict=True):
        counts = record["counts"][str(budget)]
        bottom = [0] * len(CONFIGS)
        for outcome, colour in colours.items():
            values = [counts[c].get(outcome, 0) for c in CONFIGS]
            ax.bar(CONFIGS, values, bottom=bottom, color=colour, label=outcome)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_title(f"max_tokens = {budget}")
    axes[0].set_ylabel(f"MaskBench schemas (of {record['schemas']})")
    axes[-1].legend(loc="upper right", fontsize=8)
    fig.suptitle("Outputs at the budget: valid, cut at max_tokens, invalid, refused")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def save(record: dict, out: pathlib.Path, stem: str, draw: Any) -> None:
    """``record`` as ``out/stem.json`` and its plot as ``out/stem.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    draw(record, out / f"{stem}.png")


def plot_same(record: dict, path: pathlib.Path) -> None:
    """``--same-schema``: each round's ms per step and output tokens/s, closing on and off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = record["cost"]["rounds"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, key, label in zip(axes, ("ms_per_step", "tokens_per_s"),
                              ("ms per engine step", "output tokens/s"), strict=True):  # fmt: skip
        for offset, (config, colour) in enumerate((("ours", "#2a9d8f"), ("ours_cut", "#adb5bd"))):
            values = [r[key] for r in rounds[config]]
            xs = [i + 0.4 * offset for i in range(len(values))]
            ax.bar(xs, values, width=0.4, color=colour, label=config)
        ax.set_xticks([i + 0.2 for i in range(len(rounds["ours"]))])
        ax.set_xticklabels([f"round {i + 1}" for i in range(len(rounds["ours"]))])
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    cost = record["cost"]
    fig.suptitle(f"{cost['schema']}: batch {cost['batch']}, max_tokens {cost['budget']}, "
                 "closing on (ours) and off (ours_cut)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--schemas", type=int, default=60)
    parser.add_argument("--budgets", type=int_list, default=[32, 64, 128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--same-schema", default=None,
                        help="time one batch of --batch copies of this schema (a MaskBench "
                        "file name, or three_fields) at the first budget; no judging")  # fmt: skip
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    import constrained
    from constrained.demo import engine_kwargs
    from constrained.tiny_model import build_tiny_model

    model_dir = build_tiny_model()
    llm = LLM(
        model=str(model_dir),
        logits_processors=constrained.LOGITS_PROCESSORS,
        **engine_kwargs(),
    )
    if args.same_schema is not None:
        return same_schema(llm, model_dir, args, argv)
    names = draw(args.maskbench, args.schemas, args.seed)
    schemas = {n: load_schema(args.maskbench, n) for n in names}
    per_request: dict[str, dict[str, dict[str, dict]]] = {}
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for budget in args.budgets:
        per_request[str(budget)] = {c: {} for c in CONFIGS}
        counts[str(budget)] = {c: {} for c in CONFIGS}
        for i, name in enumerate(names):
            for config in CONFIGS:
                result = judge(llm, config, name, schemas[name], budget, seed=i)
                per_request[str(budget)][config][name] = result
                tally = counts[str(budget)][config]
                tally[result["outcome"]] = tally.get(result["outcome"], 0) + 1
                if result["outcome"] == "refused":
                    key = f"refused_{result['refused_for']}"
                    tally[key] = tally.get(key, 0) + 1
        print(budget, json.dumps(counts[str(budget)]), flush=True)
    middle = args.budgets[len(args.budgets) // 2]
    admitted = [
        n
        for n in names
        if per_request[str(middle)]["ours"][n]["outcome"] != "refused"
        and per_request[str(middle)]["ours_cut"][n]["outcome"] != "refused"
    ]
    rounds: dict[str, list[dict]] = {"ours": [], "ours_cut": []}
    timed_batch(llm, "ours_cut", admitted[:4], schemas, middle)  # warm-up
    for r in range(args.rounds):
        for config in rounds:
            rounds[config].append(
                timed_batch(llm, config, admitted, schemas, middle, seed=1000 * r)
            )
    medians = {
        c: {k: statistics.median(r[k] for r in runs) for k in ("ms_per_step", "tokens_per_s")}
        for c, runs in rounds.items()
    }
    cost = {
        "budget": middle,
        "batch": len(admitted),
        "median": medians,
        "rounds": rounds,
        "step_ratio_ours_to_cut": medians["ours"]["ms_per_step"]
        / medians["ours_cut"]["ms_per_step"],
        "tokens_ratio_ours_to_cut": medians["ours"]["tokens_per_s"]
        / medians["ours_cut"]["tokens_per_s"],
        # each round's two batches ran back to back: their ratio drifts less with the machine
        "round_tokens_ratios": [
            ours["tokens_per_s"] / cut["tokens_per_s"]
            for ours, cut in zip(rounds["ours"], rounds["ours_cut"], strict=True)
        ],
    }
    print("cost", json.dumps(cost), flush=True)
    llm.llm_engine.engine_core.shutdown()  # the processor alone, with the machine to itself
    cost["processor"] = processor_cost(
        pathlib.Path(model_dir), admitted[:32], schemas, steps=48, rounds=args.rounds
    )
    print("processor", json.dumps(cost["processor"]["ms_per_step"]), flush=True)
    record = {
        "command": "python -m benchmarks.budget_closing " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "schemas": len(names),
        "budgets": args.budgets,
        "counts": counts,
        "cost": cost,
        "per_request": per_request,
    }
    save(record, pathlib.Path(args.out), "budget_closing", plot)
    return 0


def same_schema(llm: Any, model_dir: pathlib.Path, args: argparse.Namespace,
                argv: list[str] | None) -> int:  # fmt: skip
    """``--same-schema``: one batch of ``--batch`` requests with one schema (the case of a
    service with one response format), ``ours`` and ``ours_cut`` alternated over
    ``--rounds``; then the processor alone on the same batch."""
    name = args.same_schema
    if name == "three_fields":
        from benchmarks.vllm_structured_step import THREE_FIELDS

        schema = THREE_FIELDS
    else:
        schema = load_schema(args.maskbench, name)
    budget, names, schemas = args.budgets[0], [name] * args.batch, {name: schema}
    timed_batch(llm, "ours_cut", names[:4], schemas, budget)  # warm-up (compiles)
    rounds: dict[str, list[dict]] = {"ours": [], "ours_cut": []}
    for r in range(args.rounds):
        for config in rounds:
            rounds[config].append(timed_batch(llm, config, names, schemas, budget, 1000 * r))
    medians = {
        c: {k: statistics.median(x[k] for x in runs) for k in ("ms_per_step", "tokens_per_s")}
        for c, runs in rounds.items()
    }
    cost = {"schema": name, "budget": budget, "batch": args.batch, "median": medians,
            "rounds": rounds,
            "step_ratio_ours_to_cut": medians["ours"]["ms_per_step"]
            / medians["ours_cut"]["ms_per_step"],
            "tokens_ratio_ours_to_cut": medians["ours"]["tokens_per_s"]
            / medians["ours_cut"]["tokens_per_s"]}  # fmt: skip
    print("cost", json.dumps(cost), flush=True)
    llm.llm_engine.engine_core.shutdown()  # the processor alone, with the machine to itself
    cost["processor"] = processor_cost(model_dir, names, schemas, 48, args.rounds, budget)
    print("processor", json.dumps(cost["processor"]["ms_per_step"]), flush=True)
    record = {
        "command": "python -m benchmarks.budget_closing " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "cost": cost,
    }
    save(record, pathlib.Path(args.out), "budget_closing_same_schema", plot_same)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
