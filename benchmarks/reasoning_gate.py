"""Thinking first: what a constrained request costs per step while it thinks.

The grammar processor alone (no engine), driven as V1 drives it, a batch of ``--batch``
requests with the same JSON schema, in three configurations, alternated over ``--rounds``:

- ``thinking``: ``reasoning_end="</think>"``, no ``max_reasoning_tokens``, a budget that never
  forces the marker (every row thinks every step: free, end-of-sequence banned);
- ``plain``: no options at all (the processor has no row to fill);
- ``constrained``: the schema from the first token (the grammar's mask every step).

Random logits; tokens sampled from the processed rows (the marker never comes: the thinking
rows stay thinking). Timed: ``update_state`` + ``apply`` per step.

Then end to end (``--engine-rounds``, 0 to skip): the real engine (the tiny Qwen2 model, our
processors registered, one ``LLM``), a batch of ``--batch`` prompts generating
``--engine-tokens`` tokens each, ``thinking`` against ``plain`` (and ``constrained``, whose
requests stop once their JSON closes), rounds alternated; output tokens per second of
generation wall time. ``close_at_max_tokens`` off and no ``max_reasoning_tokens``, so every
thinking row thinks for all its tokens.

Writes ``reasoning_gate.json`` and ``reasoning_gate.png`` under ``--out``.

Usage::

    python -m benchmarks.reasoning_gate                    # batch 32, 64 steps, 5 rounds
    python -m benchmarks.reasoning_gate --batch 4 --steps 8 --rounds 1 --engine-rounds 1 \\
        --engine-tokens 16 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

from benchmarks.common import machine_info

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}
CONFIGS = ("thinking", "plain", "constrained")


def extra_for(config: str) -> dict | None:
    if config == "plain":
        return None
    extra: dict[str, Any] = {"json_schema": json.dumps(SCHEMA)}
    if config == "thinking":
        extra["reasoning_end"] = "</think>"
    return extra


def one_round(model_dir: str, width: int, config: str, batch: int, steps: int, seed: int) -> float:
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from constrained.processors.grammar_mask import GrammarMaskProcessor
    from tests.simulate import fake_vllm_config

    torch.manual_seed(seed)
    vllm_config = fake_vllm_config(batch, width, model_dir)
    proc = GrammarMaskProcessor(vllm_config, torch.device("cpu"), False)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    params = SamplingParams(temperature=1.0, max_tokens=100_000, extra_args=extra_for(config))
    added = [(i, params, [1, 2, 3], outputs[i]) for i in range(batch)]
    update: Any = BatchUpdate(batch_size=batch, removed=[], added=added, moved=[])
    seconds = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, width)
        start = time.perf_counter()
        proc.update_state(update)
        out = proc.apply(logits)
        seconds += time.perf_counter() - start
        update = None
        noise = -torch.log(-torch.log(torch.rand_like(out).clamp_min(1e-9)))
        for row, token in enumerate((out + noise).argmax(dim=-1).tolist()):
            outputs[row].append(token)
    return 1000 * seconds / steps


def engine_rounds(model_dir: str, batch: int, tokens: int, rounds: int) -> dict[str, list[float]]:
    """Output tokens per second of ``LLM.generate`` per configuration and round."""
    from vllm import LLM, SamplingParams

    import constrained
    from constrained.demo import engine_kwargs

    llm = LLM(model=model_dir, logits_processors=constrained.LOGITS_PROCESSORS,
              **{**engine_kwargs(), "max_num_seqs": batch})  # fmt: skip
    prompts = [f"Question {i}: think, then answer in JSON." for i in range(batch)]
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(rounds + 1):  # the first round warms up: not counted
        for config in CONFIGS:
            extra = extra_for(config)
            if extra is not None:
                extra["close_at_max_tokens"] = False
            params = [
                SamplingParams(temperature=1.0, seed=1000 * r + i, max_tokens=tokens,
                               ignore_eos=config == "plain", extra_args=extra)
                for i in range(batch)
            ]  # fmt: skip
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            made = sum(len(o.outputs[0].token_ids) for o in outputs)
            if r:
                results[config].append(made / seconds)
    llm.llm_engine.engine_core.shutdown()
    return results


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engine = record.get("engine_tokens_per_s")
    fig, axes = plt.subplots(1, 2 if engine else 1, figsize=(9 if engine else 5, 3.2))
    axes = list(axes) if engine else [axes]
    colors = ["#2a9d8f", "#adb5bd", "#e76f51"]
    axes[0].bar(CONFIGS, [record["ms_per_step"][c] for c in CONFIGS], color=colors)
    axes[0].set_ylabel("ms per step (processor alone)")
    axes[0].set_title(f"Grammar processor, batch {record['batch']}, V1")
    if engine:
        axes[1].bar(CONFIGS, [engine[c] for c in CONFIGS], color=colors)
        axes[1].set_ylabel("output tokens / s (engine)")
        axes[1].set_title(f"End to end, batch {record['batch']}, CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine-rounds", type=int, default=5)
    parser.add_argument("--engine-tokens", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    from constrained.tiny_model import build_tiny_model

    model_dir = str(build_tiny_model())
    width = AutoConfig.from_pretrained(model_dir).vocab_size
    one_round(model_dir, width, "thinking", 4, 4, 0)  # warm-up: vocabulary tables, compile
    rounds: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS:
            rounds[config].append(one_round(model_dir, width, config, args.batch, args.steps, r))
    medians = {c: statistics.median(v) for c, v in rounds.items()}
    record = {
        "command": "python -m benchmarks.reasoning_gate " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "batch": args.batch,
        "steps": args.steps,
        "ms_per_step": medians,
        "rounds": rounds,
    }
    print(json.dumps({"ms_per_step": medians}), flush=True)
    if args.engine_rounds:
        engine = engine_rounds(model_dir, args.batch, args.engine_tokens, args.engine_rounds)
        record["engine_tokens"] = args.engine_tokens
        record["engine_rounds"] = engine
        record["engine_tokens_per_s"] = {c: statistics.median(v) for c, v in engine.items()}
        print(json.dumps({"engine_tokens_per_s": record["engine_tokens_per_s"]}), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reasoning_gate.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out / "reasoning_gate.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
