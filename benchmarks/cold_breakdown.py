"""Where a new schema's milliseconds go before its first constrained token (#55, "profile
first"), stage by stage, in one process without an engine.

For ``--schemas`` MaskBench schemas drawn with a fixed seed (``budget_closing.draw``), each
new to the process (``--backends``: each backend compiles each schema once, its compile
cache and store unused), timed one after another:

- ``options``: our keys parsed and the schema checked (``Options.from_extra_args``: size,
  depth, meta-schema, ``$ref`` loops, no valid instance); the API process's admission does
  this, and the engine's again;
- ``compile``: ``compile_now`` with that backend (what admission's compile costs, cached
  for the engine in the same process, handed over through the store otherwise; llguidance
  checks the grammar here and builds its parser with the first matcher, in the next stage);
- ``root_witness``: the walk admission's budget check takes (``ClosingTables.root_witness``);
- ``rise``: the first request's closing layer built (``closing_layer`` at
  ``--max-tokens``) and the rise probe where it is walked (a reach under ``MAX_RISE``; in
  the engine, by the first row that comes within ``MAX_RISE`` tokens of its need: a request
  that ends before never walks it);
- ``first_row``: that layer's first row (``fill``).

Once per engine, before any schema: the tokenizer's tables (``vocab``: the store's
fingerprint, llguidance's and xgrammar's tokenizers; each process builds them when its first
constrained request comes). Writes ``cold_breakdown.json`` and ``cold_breakdown.png`` under
``--out``.

    python -m benchmarks.cold_breakdown                          # 64 schemas, 3 backends
    python -m benchmarks.cold_breakdown --schemas 8 --out /tmp/cold_smoke
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Any

from benchmarks.budget_closing import DEFAULT_MASKBENCH, draw, load_schema
from benchmarks.common import machine_info, str_list

STAGES = ("options", "compile", "root_witness", "rise", "first_row")
WIDTH = 151_936  # the embedded tiny Qwen2's logits


def _timed(call: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = call()
    return value, (time.perf_counter() - start) * 1e3


def vocab_tables(tokenizer_dir: str) -> tuple[Any, dict[str, float]]:
    """The vocabulary, and what each of its one-time tables took (ms)."""
    from constrained.grammars import load_vocab

    vocab, load = _timed(lambda: load_vocab(tokenizer_dir, WIDTH))
    once = {"load": load}
    for name in ("fingerprint", "llguidance", "xgrammar"):
        once[name] = _timed(getattr(vocab, name))[1]
    return vocab, once


def stages_of(schema: Any, backend: str, vocab: Any, max_tokens: int) -> dict[str, float]:
    """One schema's stages (ms) with one backend; ``refused`` when it does not compile."""
    import torch

    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.closing_matcher import closing_layer
    from constrained.grammars.closing_tables import tables_of
    from constrained.grammars.matcher import words_for
    from constrained.options import Options

    times: dict[str, float] = {}
    extra = {"json_schema": schema, "grammar_backend": backend}
    options, times["options"] = _timed(lambda: Options.from_extra_args(extra, logits_width=WIDTH))
    spec = GrammarSpec("json_schema", options.json_schema, backend)
    try:
        grammar, times["compile"] = _timed(lambda: compile_now(spec, vocab))
    except Exception:  # refused: a keyword this backend does not enforce
        return {"refused": 1.0}
    tables = tables_of(grammar)
    _, times["root_witness"] = _timed(lambda: tables.root_witness(vocab))

    def rise_and_layer() -> Any:
        layer = closing_layer(grammar, vocab, max_tokens, json=True)
        if layer.rise is not None:  # (probed by its first row that comes near: timed here)
            layer.rise()
        return layer

    layer, times["rise"] = _timed(rise_and_layer)
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    _, times["first_row"] = _timed(lambda: layer.fill(bitmask, 0))
    return times


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    done = [run for run in runs if "refused" not in run]
    out: dict[str, Any] = {"schemas": len(runs), "refused": len(runs) - len(done)}
    for stage in (*STAGES, "total"):
        values = sorted(run.get(stage, sum(run[s] for s in STAGES)) for run in done)
        if values:
            out[stage] = {
                "median_ms": round(statistics.median(values), 2),
                "p90_ms": round(values[int(0.9 * (len(values) - 1))], 2),
                "max_ms": round(values[-1], 2),
                "sum_ms": round(sum(values), 1),
            }
    return out


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(result["backends"])
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(backends)
    for stage in STAGES:
        sums = [result["backends"][b].get(stage, {}).get("sum_ms", 0.0) for b in backends]
        ax.bar(backends, sums, bottom=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, sums, strict=True)]
    ax.set_ylabel(f"ms over {result['drawn']} new schemas (admitted ones)")
    ax.set_title("A new schema's cost before its first token, by stage")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--schemas", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", type=str_list, default=["llguidance", "xgrammar", "auto"])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path("benchmarks/results/cold_breakdown"))  # fmt: skip
    args = parser.parse_args(argv)

    from constrained.tiny_model import build_tiny_model

    vocab, once = vocab_tables(str(build_tiny_model()))
    names = draw(args.maskbench, args.schemas, args.seed)
    from constrained.schema import user_input

    backends = {}
    for backend in args.backends:
        user_input._checked.cache_clear()  # each backend's requests: new schemas
        runs = [
            stages_of(load_schema(args.maskbench, name), backend, vocab, args.max_tokens)
            for name in names
        ]
        backends[backend] = summary(runs)
        print(backend, json.dumps(backends[backend]), flush=True)
    result = {
        "command": "python -m benchmarks.cold_breakdown " + " ".join(argv or sys.argv[1:]),
        "drawn": len(names),
        "max_tokens": args.max_tokens,
        "vocab_once_ms": {k: round(v, 1) for k, v in once.items()},
        "backends": backends,
        "machine": machine_info(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cold_breakdown.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "cold_breakdown.png")
    print(json.dumps(result["vocab_once_ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
