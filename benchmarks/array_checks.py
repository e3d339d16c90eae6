"""What ``uniqueItems`` / ``contains`` cost per mask: the checked matcher against the backend
alone.

For each schema below, instances with ``--items`` items are serialized compactly, tokenized
with the tiny model's Qwen2 tokenizer and walked token by token (as ``benchmarks/maskbench.py``
does): before each token the mask is filled and timed, then the token consumed. Two
configurations, alternated over ``--rounds``:

- ``checked``: ``compile_now`` of the schema (llguidance's grammar of the schema without the
  array keywords, and our checks: ``grammars/checked_matcher.py``);
- ``backend``: the same llguidance grammar alone (what the schema costs without the checks).

Timed: ``fill`` per token (the backend's fill plus, for ``checked``, ``narrow``). Reported per
schema: p50 / p99 / max over every token of every round, and the ratio of the p50s.

Writes ``array_checks.json`` and ``array_checks.png`` under ``--out``.

Usage::

    python -m benchmarks.array_checks                       # 8 items, 5 rounds
    python -m benchmarks.array_checks --items 3 --rounds 1 --out /tmp/smoke
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
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.common import machine_info, percentile

WIDTH = 151_936
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "zeta", "iota"]
SCHEMAS: dict[str, dict] = {
    "strings": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "enum": {"type": "array", "items": {"enum": WORDS}, "uniqueItems": True},
    "integers": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                 "uniqueItems": True},
    "objects": {"type": "array", "uniqueItems": True, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"], "additionalProperties": False}},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7},
                 "minContains": 2},
    "in an object": {"type": "object", "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["title", "tags"], "additionalProperties": False},
}  # fmt: skip
CONFIGS = ("checked", "backend")


def instance(name: str, items: int, rng: random.Random) -> Any:
    words = rng.sample(WORDS, len(WORDS))
    strings = [f"{words[i % len(words)]} {i}" for i in range(items)]
    if name == "strings":
        return strings
    if name == "enum":
        return words[: min(items, len(words))]
    if name == "integers":
        return rng.sample(range(100), items)
    if name == "objects":
        return [{"id": i, "name": s} for i, s in enumerate(strings)]
    if name == "contains":
        return [7, *rng.sample(range(100, 999), items - 2), 7]
    return {"title": "a title of a few words", "tags": strings}


def walk(compiled: Any, tokens: list[int], walker: Any) -> list[float]:
    """Fill (timed, µs) then consume, for every token."""
    matcher = compiled.matcher()
    times = []
    for token in tokens:
        start = time.perf_counter_ns()
        matcher.fill(walker.bitmask, 0)
        times.append((time.perf_counter_ns() - start) / 1000)
        if not (int(walker.words[token >> 5]) >> (token & 31)) & 1:
            raise AssertionError(f"token {token} refused")
        if not matcher.consume([token]):
            raise AssertionError(matcher.error)
    return times


def run(items: int, rounds: int) -> dict:
    from constrained.grammars import GrammarSpec, compile_now, load_vocab
    from constrained.tiny_model import build_tiny_model
    from tests.walker import Walker

    walker = Walker(load_vocab(str(build_tiny_model()), WIDTH))
    rng = random.Random(0)
    results: dict[str, Any] = {}
    for name, schema in SCHEMAS.items():
        checked = compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
        grammars = {"checked": checked, "backend": checked.inner}
        instances = [instance(name, items, rng) for _ in range(4)]
        token_lists = [walker.tokens(x) for x in instances]
        times: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for round_no in range(rounds):
            order = CONFIGS if round_no % 2 == 0 else CONFIGS[::-1]
            for config in order:
                for tokens in token_lists:
                    times[config] += walk(grammars[config], tokens, walker)
        summary = {
            c: {
                "p50": percentile(times[c], 50),
                "p99": percentile(times[c], 99),
                "max": max(times[c]),
                "masks": len(times[c]),
            }
            for c in CONFIGS
        }
        summary["p50_ratio"] = summary["checked"]["p50"] / summary["backend"]["p50"]
        summary["tokens_per_instance"] = sum(map(len, token_lists)) / len(token_lists)
        results[name] = summary
        print(
            f"{name:>13}: checked p50 {summary['checked']['p50']:.1f} µs "
            f"p99 {summary['checked']['p99']:.1f}, backend p50 {summary['backend']['p50']:.1f} "
            f"p99 {summary['backend']['p99']:.1f} (x{summary['p50_ratio']:.2f})",
            flush=True,
        )
    return results


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(record["schemas"])
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.38
    for i, config in enumerate(CONFIGS):
        xs = [n + (i - 0.5) * width for n in range(len(names))]
        p50 = [record["schemas"][name][config]["p50"] for name in names]
        p99 = [record["schemas"][name][config]["p99"] for name in names]
        ax.bar(xs, p50, width, label=f"{config} p50", color=("#2a9d8f", "#adb5bd")[i])
        ax.scatter(xs, p99, marker="_", s=200, color="black", label="p99" if i else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("µs per mask")
    ax.set_title(f"Mask fill with the array checks vs the backend alone ({record['items']} items)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    args = parser.parse_args(argv)
    record = {
        "benchmark": "array_checks",
        "machine": machine_info(),
        "items": args.items,
        "rounds": args.rounds,
        "schemas": run(args.items, args.rounds),
        "note": "µs per mask fill; checked = backend fill + array checks (narrow)",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "array_checks.json").write_text(json.dumps(record, indent=1))
    plot(record, args.out / "array_checks.png")
    print(f"wrote {args.out / 'array_checks.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
