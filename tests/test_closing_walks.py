"""Closing through uniform random walks (the model replaced by uniform choices among the
allowed tokens; ``tests/closing_walk.py``, the walks of ``benchmarks/closing_walks.py``) on a
few MaskBench schemas and hand cases: at the least budgets admission takes, every output
ends complete and valid by ``max_tokens``; with room, every row along the same walks equals
the row with closing off and the total-variation estimate is exactly 0.
"""

from __future__ import annotations

import json
import pathlib
import random
import zlib

import pytest
import torch

from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.closing import root_witness
from constrained.grammars.matcher import words_for
from tests.closing_walk import Rows, closing_stack, judge, replay, walk

WIDTH = 151_936
MASKBENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"
FILES = ["Github_easy---o10008.json", "Github_easy---o66162.json", "JME_38.json"]
# Every path of this one is at most 20 tokens ('{"a":"yy","b":false}' written a byte a token).
FINITE = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
NESTED = {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
          "properties": {"id": {"type": "integer"}, "tag": {"type": "string", "maxLength": 6}},
          "required": ["id", "tag"]}}  # fmt: skip
CAP = 48


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


def schemas() -> list[tuple[str, dict]]:
    found = [("finite", FINITE), ("nested", NESTED)]
    for name in FILES:
        path = MASKBENCH / name
        if path.exists():
            found.append((name, json.loads(path.read_text())["schema"]))
    return found


@pytest.mark.parametrize(
    ("name", "schema"), schemas(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_walks_end_complete_and_rows_with_room_are_untouched(vocab, name, schema):
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)
    bitmask = torch.zeros(2, words_for(WIDTH), dtype=torch.int32)
    rng = random.Random(zlib.crc32(name.encode()))
    need = len(root_witness(compiled, vocab)) + 1
    for budget in (need, need + 4):  # admission's least budget, and a few tokens more
        for _ in range(4):
            done = walk(closing_stack(compiled, vocab, budget), vocab, bitmask, rng, budget)
            assert done.ended == "eos" and not done.warned, (name, budget, done)
            assert len(done.tokens) + 1 <= budget
            assert judge(done.tokens, vocab, schema) == "valid", (name, budget, done.tokens)
    walks = [walk(compiled.matcher(), vocab, bitmask, rng, CAP) for _ in range(4)]
    assert all(w.ended in ("eos", "cut") for w in walks)
    budgets = [2 * CAP + 64]
    if name == "finite":
        budgets.append(21)  # the longest output plus one: every path fits
    for budget in budgets:
        rows = Rows(budget=budget)
        for w in walks:
            replay(compiled, vocab, bitmask, w.tokens, w.ended, budget, rows, 2, rng)
        assert rows.rows > 0 and rows.differing == 0 and rows.left_support == 0, rows
        assert rows.added == 0
        assert all(term == 0.0 for term in rows.tv_terms), rows.tv_terms


def test_replay_counts_a_narrowed_row_and_its_distance(vocab):
    """At a budget every path does not fit, the replay sees the narrowed rows, the tokens
    cleared have no completion in reach (none needless), and the distance is positive."""
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(NESTED)), vocab)
    bitmask = torch.zeros(2, words_for(WIDTH), dtype=torch.int32)
    rng = random.Random(7)
    need = len(root_witness(compiled, vocab)) + 1
    walks = [walk(compiled.matcher(), vocab, bitmask, rng, CAP) for _ in range(6)]
    rows = Rows(budget=need + 2)
    for w in walks:
        replay(compiled, vocab, bitmask, w.tokens, w.ended, need + 2, rows, 4, rng)
    assert rows.differing > 0 and rows.verified > 0 and rows.needless == 0, rows
    assert rows.added == 0
    assert sum(rows.tv_terms) > 0
