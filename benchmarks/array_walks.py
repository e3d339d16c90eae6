"""Random walks through the array checks' masks: no dead end, no invalid ``stop`` (#27).

For every MaskBench schema (``../shared/data/maskbench``) whose plan has array checks
(``uniqueItems`` / ``contains`` / ``minContains`` / ``maxContains``) and that compiles with
``auto``, ``--walks`` random walks: each step a token drawn uniformly among those the mask
allows, up to ``--steps`` tokens; end-of-sequence, when the mask allows it and the draw takes
it, ends the walk (that output must validate); otherwise the walk is finished with
``closing.find_witness`` (the shortest completion the masks allow). Counted: walks, rows
where the checks left nothing (``CheckedMatcher.stuck``), outputs that do not validate
(``jsonschema``, format assertions off), walks no witness could finish. Deterministic seeds
(``zlib.crc32`` of the file name).

Usage::

    python -m benchmarks.array_walks                 # every schema, 5 walks each
    python -m benchmarks.array_walks --limit 20      # smoke test

Writes ``--out``/array_walks.json.
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "maskbench"
CHECKED = ("uniqueItems", "contains", "minContains", "maxContains")


@dataclass
class Walk:
    """One random walk: its text, how it ended and what went wrong."""

    text: str
    ended: str  # "eos" (drawn where allowed), "witness" (finished), "unfinished"
    stuck: bool
    valid: bool | None  # None: not finished


@dataclass
class Tally:
    schemas: int = 0
    walks: int = 0
    stuck: int = 0
    invalid: int = 0
    unfinished: int = 0
    eos_ends: int = 0
    failures: list[dict] = field(default_factory=list)

    def add(self, name: str, walk: Walk) -> None:
        self.walks += 1
        self.stuck += walk.stuck
        self.invalid += walk.valid is False
        self.unfinished += walk.ended == "unfinished"
        self.eos_ends += walk.ended == "eos"
        if (walk.stuck or walk.valid is False) and len(self.failures) < 50:
            self.failures.append({"schema": name, "text": walk.text[:300], "ended": walk.ended,
                                  "stuck": walk.stuck, "valid": walk.valid})  # fmt: skip


def validator(schema: dict) -> Any:
    """``jsonschema``'s validator for ``schema``'s draft (2020-12 by default), no formats."""
    from jsonschema import validators

    return validators.validator_for(schema, default=validators.Draft202012Validator)(schema)


def random_walk(grammar: Any, vocab: Any, bitmask: Any, rng: random.Random, steps: int,
                check: Any, witness_limit: int = 200) -> Walk:  # fmt: skip
    """One walk: uniform draws among the allowed tokens (end-of-sequence included where
    allowed) for at most ``steps`` tokens, then the shortest completion the masks allow."""
    from constrained.grammars.closing import allowed_ids, find_witness

    pieces, eos = vocab.token_bytes(), vocab.eos_token_id
    matcher, tokens, ended = grammar.matcher(), [], None
    for _ in range(steps):
        matcher.fill(bitmask, 0)
        ids = allowed_ids(bitmask[0], vocab.width).nonzero()[0]
        token = int(ids[rng.randrange(len(ids))])
        if token == eos:
            ended = "eos"
            break
        if not matcher.consume([token]):
            raise AssertionError(f"a token its own mask allowed was refused: {matcher.error}")
        tokens.append(token)
    if ended is None:
        rest = find_witness(matcher, vocab, witness_limit) if matcher.error is None else None
        if rest is None:
            text = b"".join(pieces[t] for t in tokens).decode(errors="replace")
            return Walk(text, "unfinished", bool(getattr(matcher, "stuck", False)), None)
        assert matcher.consume(rest) and matcher.accepts_end()
        tokens += rest
        ended = "witness"
    raw = b"".join(pieces[t] for t in tokens)
    try:
        valid = bool(check.is_valid(json.loads(raw)))
    except ValueError:
        valid = False
    stuck = bool(getattr(matcher, "stuck", False))
    return Walk(raw.decode(errors="replace"), ended, stuck, valid)


def checked_schemas(data_dir: pathlib.Path) -> list[tuple[str, dict]]:
    """MaskBench schemas whose plan has array checks (file name, schema)."""
    from constrained.errors import GrammarError
    from constrained.schema.array_checks import plan_checks

    found = []
    for path in sorted(data_dir.glob("*.json")):
        text = path.read_text()
        if not any(f'"{key}"' in text for key in CHECKED):
            continue
        schema = json.loads(text)["schema"]
        try:
            if plan_checks(json.dumps(schema), "auto") is None:
                continue
        except (GrammarError, ValueError, TypeError):
            pass  # refused: counted by the caller's compile
        found.append((path.name, schema))
    return found


def run(cases: list[tuple[str, dict]], walks: int, steps: int, vocab: Any) -> tuple[Tally, dict]:
    import torch

    from constrained.errors import GrammarError
    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.checked_matcher import CheckedGrammar
    from constrained.grammars.matcher import words_for

    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    tally, refused = Tally(), {}
    for name, schema in cases:
        try:
            grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)
        except GrammarError as exc:
            refused[name] = str(exc)[:200]
            continue
        except Exception as exc:  # a schema jsonschema or a backend cannot read
            refused[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if not isinstance(grammar, CheckedGrammar):
            continue
        tally.schemas += 1
        check = validator(schema)
        rng = random.Random(zlib.crc32(name.encode()))
        for _ in range(walks):
            tally.add(name, random_walk(grammar, vocab, bitmask, rng, steps, check))
    return tally, refused


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=DATA)
    parser.add_argument("--walks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    from benchmarks.common import machine_info
    from constrained.grammars import load_vocab
    from constrained.tiny_model import build_tiny_model
    from tests.test_schema_suite import WIDTH

    vocab = load_vocab(str(build_tiny_model()), WIDTH)
    cases = checked_schemas(args.data)[: args.limit]
    start = time.perf_counter()
    tally, refused = run(cases, args.walks, args.steps, vocab)
    result = {
        "schemas_with_checks": len(cases),
        "schemas_walked": tally.schemas,
        "refused_at_compile": len(refused),
        "walks": tally.walks,
        "stuck": tally.stuck,
        "invalid": tally.invalid,
        "unfinished": tally.unfinished,
        "ended_by_eos": tally.eos_ends,
        "walks_per_schema": args.walks,
        "steps": args.steps,
        "seconds": round(time.perf_counter() - start, 1),
        "failures": tally.failures,
        "refused": refused,
        "machine": machine_info(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "array_walks.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result.items() if k not in ("failures", "refused", "machine")}
    print(json.dumps(summary))
    if tally.stuck or tally.invalid:
        sys.exit(1)


if __name__ == "__main__":
    main()
