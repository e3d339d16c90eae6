"""Random walks through closing's masks over MaskBench (#27): complete by ``max_tokens`` at
small budgets, and no distortion where the budget leaves room.

The model is replaced by uniform choices among the tokens a row allows (end-of-sequence
included where allowed). For each MaskBench schema drawn (``--schemas N``, seed ``--seed``;
``0``: every file; ``--only``: these files) that compiles with ``auto`` (or ``--backend``),
as the engine compiles it (closing on: ``tests.closing_walk.closing_stack``, the stack
``stack.build_stack`` builds for a request that does not think first; closing off: the
compiled grammar's own matcher):

1. **Closing off**: ``--walks`` walks of at most ``--cap`` tokens. ``longest``: the most
   tokens (end-of-sequence included) of a walk that ended by end-of-sequence.
2. **Small budgets** (closing on): ``max_tokens = need + s`` for each ``s`` of ``--slack``
   (``need``: the root witness's tokens plus end-of-sequence, the least budget admission
   takes), ``--walks`` walks each. Counted: outputs that end by end-of-sequence within
   ``max_tokens`` and validate (``jsonschema``, the schema's draft, formats not asserted;
   ``format_invalid``: those the draft's format checker refuses besides), ``cut`` (reached
   ``max_tokens`` without ending), ``invalid`` ends (end-of-sequence on text that does not
   parse or validate), ``stuck`` rows (nothing allowed), refused tokens, ``stale`` walks
   (closing's witness did not complete from where the output was: a check made at another
   state), and walks where closing said it could not apply (its one log line).
3. **Budgets with room** (closing on vs off, along the same walks): each closing-off walk
   replayed through a closing-on stack at ``max_tokens = longest + 1`` (``tight``: the
   least budget every observed complete walk fits) and at each budget of ``--room``
   (``roomB``; the default 256, a common ``max_tokens``, and 1120: ``cap + 1024``, where
   closing's far test holds at every state of a walk whose need and ``grow`` stay within
   the 256 tokens a witness walk takes). Each row of the one compared with the other's
   (``rows``, ``differing``); a row closing narrowed has its cleared tokens sampled
   (``--verify`` a row, ``--verify-max`` a schema and budget) and a fresh witness walk
   after each within the room left:
   ``needless`` counts those where one fits (a token closing cleared though a completion
   was in reach: distortion beyond the budget's). Total variation between the outputs'
   distributions under the two (each truncated at the budget), estimated from the
   closing-off walks by importance weights: ``TV = E_off[(1 - P_on(x) / P_off(x))^+]``, with
   ``P(x)`` the product over the walk of ``1 / |row|`` (zero where ``x`` leaves the row);
   exactly 0 when every row is equal.

Writes ``closing_walks.json`` (totals, per schema, failures) and ``summary.md`` under
``--out``. Deterministic seeds (``zlib.crc32`` of the file name).

    python -m benchmarks.closing_walks --schemas 120            # ~10 min, 2 cores
    python -m benchmarks.closing_walks --schemas 4 --walks 2 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import int_list, machine_info, str_list
from benchmarks.structured.schemas import DEFAULT_MASKBENCH, load_schema
from tests.closing_walk import Rows, closing_stack, judge, replay, walk

ROOT = pathlib.Path(__file__).resolve().parent.parent
WIDTH = 151_936  # the embedded tiny Qwen2's logits


@dataclass
class SchemaRun:
    name: str
    backend: str = ""
    need: int | None = None
    off: dict = field(default_factory=dict)
    small: dict = field(default_factory=dict)
    parts: dict[str, Rows] = field(default_factory=dict)  # "tight", "room256"...
    seconds: float = 0.0

    def record(self) -> dict:
        return {"schema": self.name, "backend": self.backend, "need": self.need,
                "off": self.off, "small": self.small,
                **{part: rows.summary() for part, rows in self.parts.items()},
                "seconds": round(self.seconds, 2)}  # fmt: skip


def run_schema(name: str, schema: Any, compiled: Any, vocab: Any, args: argparse.Namespace,
               failures: list[dict]) -> SchemaRun:  # fmt: skip
    import torch

    from constrained.grammars.closing_tables import root_witness
    from constrained.grammars.matcher import words_for

    start = time.perf_counter()
    bitmask = torch.zeros(2, words_for(vocab.width), dtype=torch.int32)
    run = SchemaRun(name, getattr(compiled, "backend", type(compiled).__name__))
    pieces = vocab.token_bytes()
    text = lambda tokens: b"".join(pieces[t] for t in tokens).decode(errors="replace")  # noqa: E731
    rng = random.Random(zlib.crc32(name.encode()))
    root = root_witness(compiled, vocab)
    run.need = None if root is None else len(root) + 1
    # 1. closing off
    walks = [walk(compiled.matcher(), vocab, bitmask, rng, args.cap) for _ in range(args.walks)]
    done = [w for w in walks if w.ended == "eos"]
    longest = max((len(w.tokens) + 1 for w in done), default=None)
    ends = [w.ended for w in walks]
    run.off = {"walks": len(walks), "eos": len(done), "at_cap": ends.count("cut"),
               "stuck": ends.count("stuck"), "refused": ends.count("refused"),
               "longest": longest}  # fmt: skip
    for w in walks:
        if w.ended in ("stuck", "refused"):
            failure = {"schema": name, "part": "off", "ended": w.ended}
            failures.append({**failure, "text": text(w.tokens)[:300]})
    # 2. small budgets, closing on
    for slack in args.slack if run.need is not None else ():
        budget = run.need + slack
        counts = dict.fromkeys(("walks", "valid", "format_invalid", "unchecked", "cut",
                                "invalid", "stuck", "refused", "stale", "warned"), 0)  # fmt: skip
        for _ in range(args.walks):
            if time.perf_counter() - start > args.schema_seconds:
                break
            stack = closing_stack(compiled, vocab, budget)
            w = walk(stack, vocab, bitmask, rng, budget)
            counts["walks"] += 1
            counts["warned"] += w.warned
            verdict = judge(w.tokens, vocab, schema) if w.ended == "eos" else w.ended
            counts[verdict] += 1
            if verdict not in ("valid", "format_invalid", "unchecked"):
                failures.append({"schema": name, "part": f"budget {budget}", "ended": verdict,
                                 "tokens": len(w.tokens), "warned": w.warned,
                                 "text": text(w.tokens)[:300]})  # fmt: skip
        run.small[str(budget)] = counts
    # 3. rows along the same walks, closing on vs off
    budgets = [("tight", longest)] + [(f"room{b}", b) for b in args.room]
    for part, budget in budgets:
        rows = run.parts[part] = Rows(verify_max=args.verify_max)
        if budget is None or run.need is None or budget < run.need:
            continue
        rows.budget = budget
        for w in walks:
            if time.perf_counter() - start > args.schema_seconds:
                break
            replay(compiled, vocab, bitmask, w.tokens, w.ended, budget, rows, args.verify, rng)
        failures += [
            {"schema": name, "part": part, "ended": "needless", **e} for e in rows.examples
        ]
    run.seconds = time.perf_counter() - start
    return run


def totals(runs: list[SchemaRun]) -> dict:
    small: dict[str, int] = {}
    for run in runs:
        for counts in run.small.values():
            for key, value in counts.items():
                small[key] = small.get(key, 0) + value
    out: dict[str, Any] = {
        "schemas_walked": len(runs),
        "no_root_witness": sum(r.need is None for r in runs),
        "small": small,
    }
    for part in dict.fromkeys(part for r in runs for part in r.parts):
        parts = [r.parts[part] for r in runs if part in r.parts and r.parts[part].budget]
        terms = [t for p in parts for t in p.tv_terms]
        keys = ("walks", "rows", "differing", "cleared", "verified", "needless", "added",
                "left_support")  # fmt: skip
        out[part] = {k: sum(getattr(p, k) for p in parts) for k in keys}
        out[part]["schemas"] = len(parts)
        out[part]["schemas_differing"] = sum(p.differing > 0 for p in parts)
        out[part]["tv_mean_over_walks"] = round(sum(terms) / len(terms), 6) if terms else 0.0
        per_schema = [sum(p.tv_terms) / len(p.tv_terms) for p in parts if p.tv_terms]
        out[part]["tv_max_schema"] = round(max(per_schema), 6) if per_schema else 0.0
    out["off"] = {k: sum(r.off.get(k, 0) or 0 for r in runs if k != "longest")
                  for k in ("walks", "eos", "at_cap", "stuck", "refused")}  # fmt: skip
    return out


def summary_md(result: dict) -> str:
    t = result["totals"]
    s, lines = t["small"], []
    lines.append(f"# closing_walks: {result['command']}\n")
    machine = result["machine"]
    lines.append(f"commit {machine.get('git_commit')}, {machine.get('date_utc')}, "
                 f"{result['seconds']} s\n")  # fmt: skip
    lines.append(f"- schemas drawn {result['drawn']}, compiled {t['schemas_walked']}, refused "
                 f"{result['refused_count']}, no root witness {t['no_root_witness']}")  # fmt: skip
    lines.append(f"- closing off: {t['off']}")
    lines.append(f"- small budgets (need + {result['slack']}): {s}")
    for part, counts in t.items():
        if part == "tight" or part.startswith("room"):
            lines.append(f"- {part}: {counts}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--schemas", type=int, default=120, help="0: every file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--walks", type=int, default=8)
    parser.add_argument("--cap", type=int, default=96)
    parser.add_argument("--slack", type=int_list, default=[0, 4])
    parser.add_argument("--room", type=int_list, default=[256, 1120])
    parser.add_argument("--verify", type=int, default=3)
    parser.add_argument("--verify-max", type=int, default=24)
    parser.add_argument("--only", type=str_list, default=None, help="these files, no draw")
    parser.add_argument("--backend", default="auto", help="auto, or one backend for all")
    parser.add_argument("--max-bytes", type=int, default=0, help="skip larger files (0: none)")
    parser.add_argument("--schema-seconds", type=float, default=60.0)
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "benchmarks" / "results" / "closing_walks")  # fmt: skip
    args = parser.parse_args(argv)

    from constrained.grammars import GrammarSpec, compile_now, load_vocab
    from constrained.tiny_model import build_tiny_model

    vocab = load_vocab(str(build_tiny_model()), WIDTH)
    names = sorted(p.name for p in args.maskbench.glob("*.json"))
    if args.only:
        names = sorted(args.only)
    elif args.schemas:
        names = sorted(random.Random(args.seed).sample(names, min(args.schemas, len(names))))
    start = time.perf_counter()
    runs, refused, failures = [], {}, []
    for i, name in enumerate(names):
        if args.max_bytes and (args.maskbench / name).stat().st_size > args.max_bytes:
            refused[name] = f"skipped: over --max-bytes {args.max_bytes}"
            continue
        schema = load_schema(args.maskbench, name)
        spec = GrammarSpec("json_schema", json.dumps(schema), backend=args.backend)
        try:
            compiled = compile_now(spec, vocab)
        except Exception as exc:  # refused (a keyword no backend enforces), or unreadable
            refused[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        run = run_schema(name, schema, compiled, vocab, args, failures)
        runs.append(run)
        parts = " ".join(f"{part}={rows.summary()}" for part, rows in run.parts.items())
        print(f"[{i + 1}/{len(names)}] {name} {run.backend} need={run.need} off={run.off} "
              f"small={run.small} {parts} {run.seconds:.1f}s", flush=True)  # fmt: skip
    result = {
        "command": "python -m benchmarks.closing_walks " + " ".join(argv or sys.argv[1:]),
        "drawn": len(names),
        "refused_count": len(refused),
        "slack": args.slack,
        "walks": args.walks,
        "cap": args.cap,
        "room": args.room,
        "seconds": round(time.perf_counter() - start, 1),
        "totals": totals(runs),
        "per_schema": [r.record() for r in runs],
        "failures": sorted(failures, key=lambda f: f["ended"] == "needless")[:200],
        "refused": refused,
        "machine": machine_info(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "closing_walks.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "summary.md").write_text(summary_md(result))
    print(json.dumps(result["totals"]))
    bad = result["totals"]["small"]
    return 1 if any(bad.get(k) for k in ("invalid", "stuck", "refused", "stale")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
