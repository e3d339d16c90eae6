"""``Matcher.completes``: each backend's override against the contract's default (#27).

Closing's checks (``grammars/closing_matcher.py``) ask ``completes([token, *suffix])`` for
every allowed token of a near row; by default that is ``try_consume`` + ``accepts_end`` +
``rollback``. Here, per backend (xgrammar, outlines-core, llguidance), the checks closing
makes are collected along uniform random walks through the masks of a few hand schemas and
``--schemas`` MaskBench schemas that compile on that backend (files under ``--max-bytes``,
drawn with seed 0): at each step up to ``--tokens`` allowed tokens, each followed by the
witness found after it, whole and cut short by one token (so about half complete). Then both
ways answer every check from the same state, alternated, ``--repeats`` times; every answer
must agree. Writes ``completes_cost.json`` under ``--out``.

    python -m benchmarks.completes_cost                      # 8 MaskBench schemas a backend
    python -m benchmarks.completes_cost --schemas 2 --repeats 2 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time
from typing import Any

from benchmarks.common import machine_info
from benchmarks.structured.schemas import DEFAULT_MASKBENCH, load_schema

BACKENDS = ("xgrammar", "outlines", "llguidance")
HAND = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2},
     "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name", "age", "tags"]},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
     "ok": {"type": "boolean"}}, "required": ["id", "ok"]}, "minItems": 2},
]  # fmt: skip


def schemas_for(backend: str, vocab: Any, args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The hand schemas and the first ``--schemas`` MaskBench schemas that compile on it."""
    from constrained.grammars import GrammarSpec, compile_now

    names = sorted(p.name for p in args.maskbench.glob("*.json"))
    random.Random(0).shuffle(names)
    found = [(f"hand{i}", compile_now(GrammarSpec("json_schema", json.dumps(s), backend=backend),
                                      vocab)) for i, s in enumerate(HAND)]  # fmt: skip
    taken = 0
    for name in names:
        if taken == args.schemas:
            break
        if (args.maskbench / name).stat().st_size > args.max_bytes:
            continue
        spec = GrammarSpec("json_schema", json.dumps(load_schema(args.maskbench, name)),
                           backend=backend)  # fmt: skip
        try:
            grammar = compile_now(spec, vocab)
        except Exception:
            continue
        found.append((name, grammar))
        taken += 1
    return found


def closing_checks(grammar: Any, vocab: Any, rng: random.Random, args: argparse.Namespace
                   ) -> list[tuple[list[int], list[list[int]]]]:  # fmt: skip
    """(output so far, checks at that state) along ``--walks`` uniform random walks."""
    import torch

    from constrained.grammars.closing import allowed_ids, find_witness
    from constrained.grammars.matcher import words_for

    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    eos, found = vocab.eos_token_id, []
    for _ in range(args.walks):
        matcher, output = grammar.matcher(), []
        for _ in range(args.steps):
            matcher.fill(bitmask, 0)
            ids = allowed_ids(bitmask[0], vocab.width).nonzero()[0].tolist()
            checks = []
            for token in rng.sample(ids, min(args.tokens, len(ids))):
                if token == eos or matcher.try_consume([token]) != 1:
                    continue
                after = find_witness(matcher, vocab, 64)
                matcher.rollback(1)
                if after is not None:
                    checks += [[token, *after], [token, *after[:-1]]]
            if checks:
                found.append((list(output), checks))
            token = rng.choice(ids)
            if token == eos:
                break
            matcher.consume([token])
            output.append(token)
    return found


def timed(grammar: Any, cases: list, repeats: int) -> dict:
    """Both ways over every check, alternated; microseconds per check and the answers."""
    from constrained.grammars.matcher import Matcher

    spent = {"default": 0.0, "override": 0.0}
    checks = complete = disagree = 0
    for output, asked in cases:
        matcher = grammar.matcher()
        assert matcher.consume(output)
        ways = {"default": lambda c, m=matcher: Matcher.completes(m, c),
                "override": matcher.completes}  # fmt: skip
        for repeat in range(repeats):
            for name in ("default", "override") if repeat % 2 == 0 else ("override", "default"):
                way = ways[name]
                start = time.perf_counter()
                for check in asked:
                    way(check)
                spent[name] += time.perf_counter() - start
        for check in asked:
            answer = matcher.completes(check)
            disagree += answer is not Matcher.completes(matcher, check)
            complete += answer
            checks += 1
    per = {k: 1e6 * v / (checks * repeats) for k, v in spent.items()}
    return {"checks": checks, "complete": complete, "disagree": disagree,
            "default_us": per["default"], "override_us": per["override"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--schemas", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=3000)
    parser.add_argument("--walks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    args = parser.parse_args(argv)

    from constrained.grammars import load_vocab
    from constrained.tiny_model import build_tiny_model
    from tests.test_schema_suite import WIDTH

    vocab = load_vocab(str(build_tiny_model()), WIDTH)
    record: dict[str, Any] = {"backends": {}}
    for backend in args.backends.split(","):
        rows, total = [], {"checks": 0, "default_s": 0.0, "override_s": 0.0, "disagree": 0}
        for name, grammar in schemas_for(backend, vocab, args):
            rng = random.Random(name)
            row = {"schema": name, **timed(grammar, closing_checks(grammar, vocab, rng, args),
                                           args.repeats)}  # fmt: skip
            rows.append(row)
            total["checks"] += row["checks"]
            total["disagree"] += row["disagree"]
            total["default_s"] += row["default_us"] * row["checks"]
            total["override_s"] += row["override_us"] * row["checks"]
        summary = {
            "schemas": len(rows),
            "checks": total["checks"],
            "disagree": total["disagree"],
            "default_us_per_check": round(total["default_s"] / max(total["checks"], 1), 2),
            "override_us_per_check": round(total["override_s"] / max(total["checks"], 1), 2),
        }
        summary["speedup"] = round(
            summary["default_us_per_check"] / max(summary["override_us_per_check"], 1e-9), 2
        )
        record["backends"][backend] = {**summary, "per_schema": rows}
        print(backend, json.dumps(summary), flush=True)
    record["command"] = "python -m benchmarks.completes_cost " + " ".join(argv or sys.argv[1:])
    record["machine"] = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "completes_cost.json").write_text(json.dumps(record, indent=1) + "\n")
    return 1 if any(b["disagree"] for b in record["backends"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
