"""Numbers a double cannot hold (``1e999``) are never written (``schema.finite_numbers``,
``grammars.finite_matcher``).

- the rule on text: which numbers and prefixes read as infinite, strings left alone;
- ``may_break`` never says "safe" where a token could break the rule (generated prefixes);
- on each backend's JSON grammar, random walks that favour digits and exponents: every row
  is exactly the backend's row less the tokens that would break the rule, never empty, and
  every output that ends parses with finite numbers; ``try_consume``, ``accepted`` and
  ``completes`` agree with the rows;
- with closing at ``max_tokens``: walks end complete and finite.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
import zlib

import pytest
import torch

from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.checked_matcher import unwrapped
from constrained.grammars.finite_matcher import FiniteGrammar, tokens_of
from constrained.grammars.matcher import row_ids, words_for
from constrained.grammars.stack import build_stack
from constrained.schema.finite_numbers import START, advance, finite, may_break

WIDTH = 151_936
NUMBERS = {
    "type": "object",
    "properties": {
        "x": {"type": "number"},
        "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
        "s": {"type": "string", "maxLength": 6},
        "n": {"type": "integer"},
    },
    "required": ["x", "xs", "s", "n"],
    "additionalProperties": False,
}
ARRAY = {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3}
UNIQUE = {"type": "array", "items": {"type": "number"}, "uniqueItems": True, "maxItems": 3}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (b"1e308", True),
        (b"1.7976931348623157e308", True),
        (b"1.8e308", False),
        (b"1e309", False),
        (b"-1e999", False),
        (b"1e-999", True),
        (b"0.0001e311", True),
        (b"9" * 308, True),
        (b"9" * 309, False),  # ~1e309
        (b"1" * 309, True),  # ~1.1e308
        (b"1e", True),
        (b"1e+", True),
        (b"-", True),
        (b"12.", True),
    ],
)
def test_finite_reads_numbers_and_prefixes_as_doubles(text, ok):
    assert finite(text) is ok


def test_advance_follows_strings_escapes_and_number_ends():
    assert advance(START, b'{"a": "1e999", "b\\"1e999": 1}')[1]
    assert not advance(START, b"[1e999]")[1]
    state, ok = advance(START, b"[1, -1e3")
    assert ok and state.number == b"-1e3"
    state, ok = advance(state, b"0")
    assert ok and state.number == b"-1e30"
    assert not advance(state, b"00")[1]  # -1e3000
    assert advance(state, b"]")[1] and advance(state, b"]")[0].number == b""


def test_may_break_is_never_wrong_about_safety():
    rng = random.Random(0)
    pieces = [b"0", b"9", b"99", b"999", b"e", b"e9", b"e99", b".", b"-", b"+", b"9e", b"e+9"]
    most = max(sum(c in b"0123456789" for c in p) for p in pieces)
    checked = breaking = 0
    for _ in range(20_000):
        prefix = rng.choice([b"", b"-"]) + rng.choice([b"1", b"9", b"0."])
        prefix += b"9" * rng.choice([0, 1, 5, 150, 250, 299, 305])
        if rng.random() < 0.6:
            prefix += b"e" + rng.choice([b"", b"+", b"-"]) + b"9" * rng.choice([0, 1, 2, 3])
        state, ok = advance(START, b"[" + prefix)
        if not ok:
            continue
        for piece in pieces:
            checked += 1
            if not advance(state, piece)[1]:
                breaking += 1
                assert may_break(state, most), (prefix, piece)
    assert checked > 50_000 and breaking > 1_000


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


def grammar(vocab, schema: dict, backend: str):
    return compile_now(GrammarSpec("json_schema", json.dumps(schema), backend=backend), vocab)


def row(matcher, vocab) -> set[int]:
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    matcher.fill(bitmask, 0)
    return set(row_ids(bitmask[0].numpy().view("uint32")).tolist())


def all_finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(all_finite, value.values()))
    if isinstance(value, list):
        return all(map(all_finite, value))
    return True


def numeric_tokens(vocab) -> list[int]:
    encode = vocab.hf_tokenizer.encode
    return [encode(t, add_special_tokens=False)[0] for t in "0123456789e"]


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
@pytest.mark.parametrize("schema", [NUMBERS, ARRAY, UNIQUE], ids=["object", "array", "unique"])
def test_rows_are_the_backends_less_what_would_overflow(vocab, backend, schema):
    compiled = grammar(vocab, schema, backend)
    assert isinstance(compiled, FiniteGrammar) or isinstance(compiled.inner, FiniteGrammar)
    below = compiled.inner if isinstance(compiled, FiniteGrammar) else compiled.inner.inner
    assert below is unwrapped(compiled)
    tokens = tokens_of(vocab)
    favoured = numeric_tokens(vocab)
    rng = random.Random(zlib.crc32(f"{backend}{json.dumps(schema)}".encode()))
    cleared = ended = 0
    for _ in range(12):
        ours = compiled.matcher()
        # the same path through the grammar without this layer (array checks, if any, kept)
        theirs = (
            below.matcher()
            if isinstance(compiled, FiniteGrammar)
            else type(compiled)(below, compiled.plan, vocab).matcher()
        )
        written: list[int] = []
        for _step in range(120):
            allowed, backend_row = row(ours, vocab), row(theirs, vocab)
            assert allowed, bytes(b"".join(tokens.pieces[t] for t in written))
            state = ours.states[-1] if hasattr(ours, "states") else ours.inner.states[-1]
            expected = {t for t in backend_row if advance(state, tokens.pieces[t])[1]}
            assert allowed == expected
            cleared += len(backend_row) - len(allowed)
            others = sorted(allowed - {vocab.eos_token_id})
            if ours.accepts_end() and (not others or rng.random() < 0.05):
                break
            pick = [t for t in favoured if t in allowed]
            token = rng.choice(pick if pick and rng.random() < 0.9 else others)
            for refused in set(favoured) - expected:  # refused by the rule itself
                if refused in backend_row:
                    assert ours.accepted([refused]) == 0 and ours.try_consume([refused]) == 0
            assert ours.accepted([token]) == 1
            assert ours.consume([token]) and theirs.consume([token])
            written.append(token)
        text = b"".join(tokens.pieces[t] for t in written)
        if ours.accepts_end():
            ended += 1
            assert ours.completes([]) and theirs.completes([])
            assert all_finite(json.loads(text)), text
        else:  # still open: its numbers so far read as finite
            assert advance(START, text)[1], text
    assert cleared > 0  # the walks reached numbers a double cannot hold


def test_closing_at_max_tokens_ends_complete_and_finite(vocab):
    compiled = grammar(vocab, NUMBERS, "llguidance")
    tokens = tokens_of(vocab)
    favoured = numeric_tokens(vocab)
    rng = random.Random(3)
    for limit in (24, 40):
        for _ in range(6):
            stack = build_stack(_done(compiled), vocab, limit).matcher
            written: list[int] = []
            for _step in range(limit):
                allowed = row(stack, vocab) - {vocab.eos_token_id}
                if stack.accepts_end() and (not allowed or rng.random() < 0.2):
                    break
                assert allowed
                pick = [t for t in favoured if t in allowed]
                token = (
                    rng.choice(pick) if pick and rng.random() < 0.8 else rng.choice(sorted(allowed))
                )
                assert stack.consume([token])
                written.append(token)
            assert stack.accepts_end()
            text = b"".join(tokens.pieces[t] for t in written)
            assert all_finite(json.loads(text)), text


def _done(value):
    from concurrent.futures import Future

    future: Future = Future()
    future.set_result(value)
    return future


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_escapes_in_strings_are_followed_token_by_token(vocab, backend):
    """Strings with escaped quotes and backslashes, then a number: the matcher knows where it
    stands whichever way the tokens split the text."""
    compiled = grammar(vocab, {"type": "array", "items": {}}, backend)
    nine = vocab.hf_tokenizer.encode("9", add_special_tokens=False)
    for text in ['["a\\\\",1e99', '["\\"",1e99', '["x\\"y\\\\",{"k":"\\\\"},1e99']:
        matcher = compiled.matcher()
        tokens = vocab.hf_tokenizer.encode(text, add_special_tokens=False)
        for token in tokens:  # one at a time: the state carried across token edges
            assert matcher.consume([token]), text
        assert matcher.states[-1].number == b"1e99", text
        assert nine[0] not in row(matcher, vocab) and matcher.try_consume(nine) == 0
        assert matcher.try_consume(vocab.hf_tokenizer.encode("]", add_special_tokens=False)) == 1


HERMES_LIKE = json.dumps({"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": False,
    "stop_after_first": True, "tags": [{
        "type": "tag", "begin": '<tool_call>\n{"name": "f", "arguments": ',
        "content": {"type": "json_schema", "json_schema": {
            "type": "object", "properties": {"s": {"type": "string", "maxLength": 6},
                                             "x": {"type": "number"}},
            "required": ["s", "x"], "additionalProperties": False}},
        "end": "}\n</tool_call>"}]}})  # fmt: skip


def test_structural_tags_keep_the_rule_in_their_json_parts_only(vocab):
    """A tool call as vLLM's hermes parser asks for it: free text may say ``1e999``; the
    arguments may not, and the row is the backend's less exactly the breaking tokens."""
    from constrained.schema.finite_numbers import FREE_START

    compiled = compile_now(GrammarSpec("structural_tag", HERMES_LIKE, backend="xgrammar"), vocab)
    assert isinstance(compiled, FiniteGrammar)
    assert compiled.opens == (b'<tool_call>\n{"name": "f", "arguments": ',)
    encode = vocab.hf_tokenizer.encode
    tokens = tokens_of(vocab, tagged=True)
    nine = encode("9", add_special_tokens=False)[0]
    for free in ["Say 1e999 ", "", '"quoted {[ 2e9999 ']:
        matcher, theirs = compiled.matcher(), compiled.inner.matcher()
        text = free + '<tool_call>\n{"name": "f", "arguments": {"s":"1e999","x":1e99'
        for token in encode(text, add_special_tokens=False):
            assert matcher.consume([token]) and theirs.consume([token]), text
        state = matcher.states[-1]
        assert state.number == b"1e99"
        expected = {
            t for t in row(theirs, vocab) if advance(state, tokens.pieces[t], compiled.opens)[1]
        }
        assert row(matcher, vocab) == expected and nine not in expected
        rest = encode("}}\n</tool_call>", add_special_tokens=False)
        assert matcher.consume(rest) and matcher.accepts_end(), text
        assert matcher.states[-1].mode == FREE_START.mode


def test_free_text_finds_each_begin_where_a_plain_search_does():
    """In a tag's free text the state keeps only the text's longest end that a ``begin``
    starts with: over generated texts (pieces of the begins, overlapping ones, noise), fed
    in random chunks, JSON starts exactly after the first end of a ``begin`` that a plain
    search finds, and a chunk without a begin's first byte leaves the state as it was."""
    from constrained.schema.finite_numbers import FREE, FREE_START, OUT

    rng = random.Random(55)
    opens_sets = [
        (b'<tool_call>\n{"name": "f", "arguments": ', b'<tool_call>{"name": "f", "arguments": '),
        (b"aab", b"ab"),  # one begin inside another
        (b"abab", b"babb"),  # overlapping repeats
    ]
    for opens in opens_sets:
        atoms = [b[: rng.randint(1, len(b))] for b in opens for _ in range(4)]
        atoms += [b"x", b" ", b"\n", b"<", b"a", b"b", b"{"]
        for _ in range(400):
            text = b"".join(rng.choice(atoms) for _ in range(rng.randint(1, 12)))
            ends = [text.find(b) + len(b) for b in opens if b in text]
            first = min(ends, default=None)
            state, fed, begun_at = FREE_START, 0, None
            while fed < len(text) and begun_at is None:
                chunk = text[fed : fed + rng.randint(1, 5)]
                for i in range(len(chunk)):  # byte by byte: where JSON starts
                    state, ok = advance(state, chunk[i : i + 1], opens)
                    assert ok
                    if state.mode != FREE:
                        begun_at = fed + i + 1
                        break
                fed += len(chunk)
            assert begun_at == first, (opens, text)
            assert begun_at is None or state.mode == OUT
        firsts = {b[0] for b in opens}
        for _ in range(200):
            chunk = bytes(rng.choice(b"xyz <{ab\n") for _ in range(rng.randint(1, 6)))
            if firsts.isdisjoint(chunk):
                assert advance(FREE_START, chunk, opens) == (FREE_START, True)


class _Forgetful(dict):
    """A memo that keeps nothing: every answer worked out anew."""

    def __setitem__(self, key, value) -> None:
        pass


def test_a_grammars_memo_answers_as_the_rule_does(vocab):
    """The memo all matchers of a grammar share (``advance`` per state and token, whole runs
    for ``completes``) answers as working each out anew does: over random walks on a
    hermes-like tag, one after another on the same grammar (so earlier walks' entries serve
    later ones), every row, every ``completes`` of a few tokens ahead and every state."""
    compiled = compile_now(GrammarSpec("structural_tag", HERMES_LIKE, backend="xgrammar"), vocab)
    anew = FiniteGrammar(compiled.inner, vocab, compiled.opens)
    anew.steps, anew.runs = _Forgetful(), _Forgetful()
    rng = random.Random(7)
    encode = vocab.hf_tokenizer.encode
    opener = encode('<tool_call>\n{"name": "f", "arguments": ', add_special_tokens=False)
    for walk in range(8):  # free text, the tag's begin (whole, or cut short), then at random
        ours, theirs = compiled.matcher(), anew.matcher()
        free = encode(rng.choice(["", "Say 1e9 ", "ok "]), add_special_tokens=False)
        for token in free + opener[: len(opener) if walk % 4 else rng.randrange(len(opener))]:
            assert ours.consume([token]) and theirs.consume([token])
            assert ours.states == theirs.states
        for _ in range(60):
            allowed = sorted(row(theirs, vocab))
            assert sorted(row(ours, vocab)) == allowed and allowed
            ahead = [rng.choice(allowed) for _ in range(rng.randint(1, 3))]
            assert ours.completes(ahead) == theirs.completes(ahead)
            token = ahead[0]
            if token == vocab.eos_token_id:
                break
            assert ours.consume([token]) and theirs.consume([token])
            assert ours.states == theirs.states
    assert compiled.steps and compiled.runs and not anew.steps


def _finite_everywhere(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_everywhere(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_everywhere(v) for v in value)
    return True


@pytest.mark.parametrize("backend", ["auto", "xgrammar"])  # auto: llguidance compiles them
def test_tool_call_walks_over_glaive_tools_end_parsing_and_finite(vocab, backend):
    """Uniform random walks, closing on at ``max_tokens`` 160, through the structural tag
    vLLM's hermes parser builds for ``tool_choice: "required"`` over pairs of real tools
    (MaskBench's Glaive function schemas, a sample of 12 pairs; arguments strict, as our
    routing makes them): every walk ends with end-of-sequence, and every call in it parses,
    names one of its tools, and has arguments valid against that tool's schema in which
    every number is a finite double."""
    import re

    import jsonschema

    from benchmarks.closing_profile import tool_pair_tags
    from constrained.grammars.closing_matcher import closing_layer
    from constrained.openai_routing import strict_arguments
    from tests.closing_walk import walk

    maskbench = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"
    tags = tool_pair_tags(maskbench, 12, 0)
    assert len(tags) == 12
    pieces = tokens_of(vocab, tagged=True).pieces
    bitmask = torch.zeros(2, words_for(WIDTH), dtype=torch.int32)
    rng = random.Random(55)
    calls = 0
    for name, text in tags.items():
        tools = {
            t["begin"].split('"name": "')[1].split('"')[0]: t["content"]["json_schema"]
            for t in json.loads(text)["format"]["tags"]
        }
        spec = GrammarSpec("structural_tag", strict_arguments(text), backend)
        compiled = compile_now(spec, vocab)
        assert unwrapped(compiled).backend == {"auto": "llguidance"}.get(backend, backend)
        for _ in range(2):
            done = walk(closing_layer(compiled, vocab, 160), vocab, bitmask, rng, 160)
            assert done.ended == "eos", (name, done.ended)
            written = b"".join(pieces[t] for t in done.tokens).decode()
            found = re.findall(r"<tool_call>\n?(.*?)\n?</tool_call>", written, re.S)
            assert found and "".join(found) != "", (name, written)
            for body in found:
                call = json.loads(body)
                assert call["name"] in tools, (name, body)
                jsonschema.validate(call["arguments"], tools[call["name"]])
                assert _finite_everywhere(call["arguments"]), (name, body)
                calls += 1
    assert calls >= 24
