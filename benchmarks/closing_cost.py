"""The grammar processor's per-step cost with closing on and off, no engine (#27's target:
a batch of 64 JSON-schema requests at ``max_tokens`` 64).

Drives ``GrammarMaskProcessor`` as V1 does (``budget_closing.processor_cost``: a full batch
every step, a request that ends replaced by a fresh one of its schema), over the first
``--batch`` MaskBench schemas drawn (seed 0) whose shortest completion fits the budget.
Writes ``closing_cost.json`` under ``--out``.

    python -m benchmarks.closing_cost                  # batch 64, max_tokens 64, 5 rounds
    python -m benchmarks.closing_cost --batch 8 --rounds 1 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from benchmarks.budget_closing import DEFAULT_MASKBENCH, draw, load_schema, processor_cost
from benchmarks.common import machine_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    from constrained.grammars import GrammarSpec, compile_now, load_vocab
    from constrained.grammars.closing import find_witness
    from constrained.tiny_model import build_tiny_model

    model_dir = build_tiny_model()
    vocab = load_vocab(str(model_dir), AutoConfig.from_pretrained(model_dir).vocab_size)
    names: list[str] = []
    schemas: dict = {}
    for name in draw(args.maskbench, 4 * args.batch, 0):
        schema = load_schema(args.maskbench, name)
        try:
            matcher = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab).matcher()
        except Exception:
            continue
        witness = find_witness(matcher, vocab, args.budget - 1)
        if witness is not None:
            names.append(name)
            schemas[name] = schema
        if len(names) == args.batch:
            break
    record = processor_cost(
        model_dir, names, schemas, steps=args.steps, rounds=args.rounds, budget=args.budget
    )
    record["command"] = "python -m benchmarks.closing_cost " + " ".join(argv or sys.argv[1:])
    record["machine"] = machine_info()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "closing_cost.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        json.dumps({"ms_per_step": record["ms_per_step"], "ratio": record["ratio_closing_to_off"]})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
