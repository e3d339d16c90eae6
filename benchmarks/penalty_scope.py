"""What sparing the structure costs per step (#56): the grammar processor and the penalties,
driven as Model Runner V1 drives them (``update_state`` + ``apply``) on CPU, for a batch of
JSON requests (a list of objects with a free string), with frequency and presence penalties:

- ``none``: the JSON schema only (the grammar's own cost);
- ``whole``: penalties on every token (``penalize_structure: true``, as before #56);
- ``spared``: penalties on content only (the default): the content classes (a popcount per
  row, the JSON lexer) and the counts of content tokens.

Each configuration walks the same token paths (sampled once, from the ``none`` run); the
steps are timed, the walks' set-up is not. Ratios are of medians measured in one run.

    python -m benchmarks.penalty_scope --batch 64 --steps 48 --rounds 3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import time
from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from benchmarks.common import machine_info
from constrained.processors.grammar_mask import GrammarMaskProcessor
from constrained.processors.penalties import PenaltiesProcessor
from constrained.tiny_model import build_tiny_model
from tests.simulate import fake_vllm_config

WIDTH = 151_936
SCHEMA = json.dumps({
    "type": "array", "minItems": 2, "maxItems": 6,
    "items": {"type": "object", "additionalProperties": False, "required": ["name", "kind"],
              "properties": {"name": {"type": "string", "maxLength": 24},
                             "kind": {"enum": ["tool", "fruit", "animal"]}}},
})  # fmt: skip
CONFIGS = {
    "none": {},
    "whole": {"frequency_penalty": 1.5, "presence_penalty": 0.5, "penalize_structure": True},
    "spared": {"frequency_penalty": 1.5, "presence_penalty": 0.5},
}


def config(model: str, batch: int) -> SimpleNamespace:
    return fake_vllm_config(batch, WIDTH, model)


def run(model: str, name: str, batch: int, steps: int, paths: list[list[int]] | None) -> tuple:
    """One configuration: per-step seconds, and the paths it walked."""
    cfg = config(model, batch)
    procs = [GrammarMaskProcessor(cfg, torch.device("cpu"), False)]
    if CONFIGS[name]:
        procs.append(PenaltiesProcessor(cfg, torch.device("cpu"), False))
    extra = {"json_schema": SCHEMA, **CONFIGS[name]}
    outputs: list[list[int]] = [[] for _ in range(batch)]
    added = [(i, SamplingParams(max_tokens=10_000, extra_args=extra), [1, 2, 3], outputs[i])
             for i in range(batch)]  # fmt: skip
    update = BatchUpdate(batch_size=batch, removed=[], added=added, moved=[])
    rng = torch.Generator().manual_seed(0)
    times = []
    for step in range(steps):
        logits = torch.randn(batch, WIDTH, generator=rng)
        began = time.perf_counter()
        for proc in procs:
            proc.update_state(update if step == 0 else None)
        for proc in procs:
            logits = proc.apply(logits)
        times.append(time.perf_counter() - began)
        for i in range(batch):
            if paths is not None:
                token = paths[i][step] if step < len(paths[i]) else 0
            else:
                token = int(torch.argmax(logits[i]))
            outputs[i].append(token)
    return times, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/penalty_scope")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = str(build_tiny_model())
    _, paths = run(model, "none", args.batch, args.steps, None)  # the walks, untimed
    per_step: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        names = list(CONFIGS)[round_ % 3 :] + list(CONFIGS)[: round_ % 3]
        for name in names:
            times, _ = run(model, name, args.batch, args.steps, paths)
            per_step[name].extend(times[1:])  # (step 0 admits the batch)
    medians = {name: statistics.median(t) * 1e3 for name, t in per_step.items()}
    record = {
        "command": f"python -m benchmarks.penalty_scope --batch {args.batch} --steps "
        f"{args.steps} --rounds {args.rounds}",
        "machine": machine_info(),
        "median_ms_per_step": medians,
        "penalties_ms": {k: medians[k] - medians["none"] for k in ("whole", "spared")},
        "spared_over_whole": medians["spared"] / medians["whole"],
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "penalty_scope.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(medians, out / "penalty_scope.png", args.batch)
    print(json.dumps({k: record[k] for k in ("median_ms_per_step", "spared_over_whole")}))


def plot(medians: dict[str, float], path: pathlib.Path, batch: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(medians), list(medians.values()), color=["#999", "#c66", "#6a6"])
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"grammar + penalties, batch {batch}, V1 on CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    random.seed(0)
    main()
