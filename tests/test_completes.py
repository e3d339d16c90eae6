"""``Matcher.completes`` overridden per backend (xgrammar: the tokens' text as one string, or
a tight token loop; outlines-core: a walk of the guide's index; llguidance:
``validate_tokens``) against the contract's default (``try_consume`` + ``accepts_end`` +
``rollback``) on random walks through the masks: the same answer on every check, and the
matcher unchanged after it (same row, same ``accepts_end``).

The checks at each step are those closing makes (an allowed token and a witness after it,
the witness cut short) and others no closing check has (random tokens of the vocabulary,
end-of-sequence, special tokens, nothing), so the generic fallbacks are compared too.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.checked_matcher import unwrapped
from constrained.grammars.closing import allowed_ids, find_witness
from constrained.grammars.matcher import Matcher, words_for

WIDTH = 151_936

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "kind": {"enum": ["a", "bé", "c d"]},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SHORT = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2}[0-9]$"},
         "n": {"type": "number"}}, "required": ["code", "n"]}  # fmt: skip
LENGTHS = {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}
TOOL_CALL = json.dumps({"type": "structural_tag", "format": {
    "type": "tags_with_separator", "separator": "", "at_least_one": True,
    "stop_after_first": True, "tags": [{
        "type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
        "content": {"type": "json_schema", "json_schema": {
            "type": "object", "properties": {"n": {"enum": [1, 22]}}, "required": ["n"],
            "additionalProperties": False}},
    }]}})  # fmt: skip

# (kind, source, backend, byte-level only: xgrammar's one-string path)
CASES = [
    ("json_schema", json.dumps(PERSON), "xgrammar", True),
    ("json_schema", json.dumps(SHORT), "xgrammar", True),
    ("json_schema", json.dumps(LENGTHS), "xgrammar", True),
    ("regex", "(ab)*c[0-9]{3}", "xgrammar", True),
    ("regex", "[a-z]+@[a-z]+\\.(com|org)", "xgrammar", True),
    ("regex", "(é|ü)+[0-9]{1,2}", "xgrammar", True),
    ("grammar", 'root ::= "[" ("a" | "bb") ("," ("a" | "bb"))* "]"', "xgrammar", True),
    ("structural_tag", TOOL_CALL, "xgrammar", True),
    # token-level grammars: the tokens accepted one by one (no one-string path)
    ("grammar", 'root ::= "a" Token(TOKEN) ("b" | Token(TOKEN))* "."', "xgrammar", False),
    ("grammar", 'root ::= x "."\nx[max_tokens=3] ::= [a-z]*', "xgrammar", False),
    ("json_schema", json.dumps({**PERSON, "properties": {
        k: v for k, v in PERSON["properties"].items() if k != "kind"}}), "outlines", None),
    ("json_schema", json.dumps(LENGTHS), "outlines", None),
    ("regex", "(ab)*c[0-9]{3}", "outlines", None),
    ("regex", "(é|ü)+[0-9]{1,2}", "outlines", None),
    ("json_schema", json.dumps(PERSON), "llguidance", None),
    ("regex", "[a-z]+@[a-z]+\\.(com|org)", "llguidance", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


def grammar_of(vocab, kind: str, source: str, backend: str):
    token = vocab.hf_tokenizer.encode("xyz", add_special_tokens=False)[0]
    spec = GrammarSpec(kind, source.replace("TOKEN", str(token)), backend=backend)
    return compile_now(spec, vocab)


def checks_at(matcher, vocab, row: torch.Tensor, rng: random.Random) -> list[list[int]]:
    """What closing asks at this state (a token and a completion after it, cut short too)
    and what it never asks (random, special and end-of-sequence tokens, nothing)."""
    eos = vocab.eos_token_id
    ids = [t for t in allowed_ids(row, vocab.width).nonzero()[0].tolist() if t != eos]
    special = sorted(vocab.hf_tokenizer.all_special_ids)
    checks: list[list[int]] = [[], [eos], [rng.choice(special)]]
    witness = find_witness(matcher, vocab, 48)
    if witness is not None:
        checks += [witness, witness[:-1], [*witness, eos], witness[1:]]
    for token in rng.sample(ids, min(4, len(ids))):
        checks.append([token])
        if matcher.try_consume([token]) == 1:
            after = find_witness(matcher, vocab, 48)
            matcher.rollback(1)
            if after is not None:
                checks += [[token, *after], [token, *after[:-1]], [token, *after, token]]
                if after:
                    checks.append([token, *after[:-1], rng.choice(ids)])
    checks += [[rng.randrange(vocab.width) for _ in range(rng.randint(1, 4))] for _ in range(3)]
    if ids:
        checks.append([rng.choice(ids), rng.randrange(vocab.width), rng.choice(special)])
    return checks


@pytest.mark.parametrize(("kind", "source", "backend", "bytes_only"), CASES)
def test_completes_matches_the_default_on_random_walks(vocab, kind, source, backend, bytes_only):
    grammar = grammar_of(vocab, kind, source, backend)
    bitmask = torch.zeros(2, words_for(vocab.width), dtype=torch.int32)
    eos = vocab.eos_token_id
    if bytes_only is not None:
        assert unwrapped(grammar).byte_view()[1] is bytes_only
    answers = {True: 0, False: 0}
    for seed in range(3):
        rng = random.Random(seed)
        matcher = grammar.matcher()
        assert type(matcher).completes is not Matcher.completes  # an override, not the default
        for _ in range(30):
            matcher.fill(bitmask, 0)
            end = matcher.accepts_end()
            for check in checks_at(matcher, vocab, bitmask[0], rng):
                fast = matcher.completes(check)
                assert fast is Matcher.completes(matcher, check), (kind, source, check)
                answers[fast] += 1
            matcher.fill(bitmask, 1)  # the matcher where it was
            assert torch.equal(bitmask[0], bitmask[1]) and matcher.accepts_end() is end
            ids = allowed_ids(bitmask[0], vocab.width).nonzero()[0].tolist()
            token = rng.choice(ids)
            if token == eos:
                break
            assert matcher.consume([token])
    assert answers[True] > 20 and answers[False] > 20, answers


def test_completes_after_an_error_or_the_end(vocab):
    """A failed or finished matcher completes nothing but the empty sequence, as by default;
    one that took its whole output (llguidance stops there: it validates no end-of-sequence
    after it) completes the empty sequence."""
    for kind, source, backend, _ in (CASES[0], CASES[12], CASES[-2]):
        grammar = grammar_of(vocab, kind, source, backend)
        eos = vocab.eos_token_id
        failed = grammar.matcher()
        refused = next(t for t in range(100, vocab.width) if not failed.completes([t]))
        failed.consume([refused])
        witness = find_witness(grammar.matcher(), vocab, 48)
        finished = grammar.matcher()
        assert finished.consume([*witness, eos])
        ended = grammar.matcher()
        assert ended.consume(witness) and ended.completes([])
        for matcher in (failed, finished, ended):
            for check in ([], witness, [eos], witness[:1]):
                assert matcher.completes(check) is Matcher.completes(matcher, check)


def test_forced_bytes_inside_a_character_are_no_forced_tokens(vocab):
    """xgrammar's jump-forward string after ``é`` in ``(é|ü)+`` is the lead byte 0xC3 alone,
    which its binding cannot return as text: no forced tokens, and the witness walk goes on
    (it raised ``UnicodeDecodeError`` before)."""
    grammar = grammar_of(vocab, "regex", "(é|ü)+[0-9]", "xgrammar")
    matcher = grammar.matcher()
    assert matcher.consume(vocab.hf_tokenizer.encode("é", add_special_tokens=False))
    assert matcher.forced() == []
    witness = find_witness(matcher, vocab, 16)
    assert witness is not None and matcher.completes(witness)


def test_xgrammar_forced_tokens_are_the_forced_text_as_the_tokenizer_writes_it(vocab):
    """xgrammar's forced tokens (``forced``: walks take them first) are its jump-forward
    text as the served tokenizer writes it, special tokens a tag spells included
    (``<tool_call>``), at every state of a walk to the end."""
    for kind, source in (("structural_tag", TOOL_CALL), ("regex", "(ab)*c[0-9]{3}x"),
                         ("json_schema", json.dumps(SHORT))):  # fmt: skip
        matcher = grammar_of(vocab, kind, source, "xgrammar").matcher()
        witness = find_witness(grammar_of(vocab, kind, source, "xgrammar").matcher(), vocab, 64)
        assert witness
        xgr = matcher
        while not hasattr(xgr, "find_jump_forward_string"):  # the layers above, then xgrammar
            xgr = xgr.inner
        seen = 0
        for token in witness:
            text = xgr.find_jump_forward_string()
            expected = vocab.hf_tokenizer.encode(text, add_special_tokens=False) if text else []
            assert matcher.forced() == expected, (kind, text)
            seen += bool(text)
            assert matcher.consume([token])
        assert seen, kind  # some state forced text
    tag = grammar_of(vocab, "structural_tag", TOOL_CALL, "xgrammar").matcher()
    call = vocab.hf_tokenizer.convert_tokens_to_ids("<tool_call>")
    assert tag.forced()[:1] == [call]  # the call's begin: one special token
