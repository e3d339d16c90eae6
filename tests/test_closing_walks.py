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
from constrained.grammars.closing_tables import root_witness
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


def test_at_the_longest_walk_plus_one_no_cleared_token_had_room(vocab):
    """``benchmarks/closing_walks.py``'s tight part on a MaskBench schema where it found 9
    needless clears of 24 verified: the closing-off walks (seeded as there), replayed with
    closing on at ``max_tokens`` = the longest complete walk + 1; no cleared token sampled
    has a completion in reach. After ``{"foo`` with 8 tokens left the witness ``":``
    ``{``... took the whole room, and a narrow row's token was walked from only with
    slack, so ``":{"`` (the same text in fewer tokens) was cleared."""
    name = "Github_easy---o17668.json"
    path = MASKBENCH / name
    if not path.exists():
        pytest.skip("MaskBench is not here")
    schema = json.loads(path.read_text())["schema"]
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)
    bitmask = torch.zeros(2, words_for(WIDTH), dtype=torch.int32)
    rng = random.Random(zlib.crc32(name.encode()))
    walks = [walk(compiled.matcher(), vocab, bitmask, rng, 96) for _ in range(8)]
    budget = max(len(w.tokens) + 1 for w in walks if w.ended == "eos")
    rows = Rows(budget=budget, verify_max=24)
    for w in walks:
        replay(compiled, vocab, bitmask, w.tokens, w.ended, budget, rows, 3, rng)
    assert rows.differing > 0 and rows.verified > 0, rows  # narrowed: the budget is tight
    assert rows.needless == 0, rows.examples


def test_closing_keeps_narrowing_where_a_completion_fits(vocab):
    """Found by ``benchmarks/closing_walks.py`` (MaskBench Glaiveai2K calculate_area, budget
    17 = need + 4, one walk of 1,760 cut at ``max_tokens``). Inside an extra property's key,
    after ``#\\`` then ``uD`` (a ``\\u`` escape owing three hex digits; kept on its class's
    word: that class's ends, ``b`` or ``n``, finish an escape at once), 4 tokens are left
    and ``ace`` ``":"`` ``"}`` completes in 3 + end-of-sequence. But the witness walk writes
    ``1`` ``false`` ``":""`` ``}`` (4 tokens), found nothing in reach, and closing gave up:
    it logged that the output may be cut and left the next ``RECHECK_EVERY`` rows as the
    grammar writes them (the walk took ``aced``, ``llen``... and was cut). The escape's
    owed digits in one token (``ace``), before what completed after its class (``n``
    ``":""`` ``}``), are now a known suffix: the row narrows, and every walk from here
    completes, valid, by ``max_tokens``."""
    path = MASKBENCH / "Glaiveai2K---calculate_area_0f50c849.json"
    if not path.exists():
        pytest.skip("MaskBench is not here")
    schema = json.loads(path.read_text())["schema"]
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)
    by_bytes = {piece: token for token, piece in enumerate(vocab.token_bytes()) if piece}
    texts = [b'{"', b"dimensions", b'":{"', "につ".encode(), b" '%\"", b':")', b" woodland",
             b' $"', b'},"', b"shape", b'":"","', b"#\\", b"uD"]  # fmt: skip
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    prefix = [by_bytes[text] for text in texts]
    for seed in range(4):
        stack = closing_stack(compiled, vocab, 17)
        for token in prefix:
            stack.fill(bitmask, 0)
            assert bitmask[0, token // 32] >> (token % 32) & 1, token  # the row allows it
            assert stack.consume([token])
        assert stack.left == 4
        assert stack.inner.completes([by_bytes[b"ace"], by_bytes[b'":"'], by_bytes[b'"}']])
        rest = walk(stack, vocab, bitmask, random.Random(seed), stack.left)
        assert not stack.warned  # closing found a completion in reach and narrowed the rows
        assert rest.ended == "eos" and judge(prefix + rest.tokens, vocab, schema) == "valid"


def test_a_narrowed_row_is_never_empty(vocab):
    """Found by ``benchmarks/closing_walks.py`` (MaskBench BFCL_parallel_multiple_56 at
    budget 11, 7 of 1,760 walks): after ``":"/`` two tokens are left and only ``"}}``
    completes in time. llguidance 1.7.6's mask at that state, after the closing layer's
    history of checks, leaves ``"}}`` out although the matcher accepts it (a fresh matcher at
    the same state allows it): every allowed token was cleared and the row was empty. The
    closing layer keeps the witness's first token instead."""
    from tests.closing_walk import allowed

    path = MASKBENCH / "BFCL_parallel_multiple_56.json"
    if not path.exists():
        pytest.skip("MaskBench is not here")
    schema = json.loads(path.read_text())["schema"]
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)
    compiled.__dict__.pop("closing_tables", None)  # walked afresh (compiles are cached)
    encode = vocab.hf_tokenizer.encode
    tokens = encode('{"time_zones.get_current_time":{"location":"/', add_special_tokens=False)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack = closing_stack(compiled, vocab, 11)
    for token in tokens:
        assert token in allowed(stack, bitmask, 0, WIDTH).tolist()
        assert stack.consume([token])
    assert stack.left == 2
    close = encode('"}}', add_special_tokens=False)
    assert len(close) == 1 and stack.completes(close)
    assert allowed(stack, bitmask, 0, WIDTH).tolist() == close
