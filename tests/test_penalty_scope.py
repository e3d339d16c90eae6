"""Penalties that spare the structure (#56), under simulated V1 batches: the grammar
processor runs first, then the penalties; on every row, every step:

- a row the grammar decides (structure) keeps exactly the logits the mask gave it, bit for bit;
- an open row is penalized by the counts of the request's content tokens only, as
  ``functional.apply_penalties`` computes from a reference classification made from scratch
  (a fresh matcher and lexer over the request's output, ``grammars/content.py``'s rules).

Joins, leaves, moves, swaps and preemptions come from ``tests/simulate.py``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from constrained.grammars import compile_now, load_vocab
from constrained.grammars.content import JsonLexer, open_row
from constrained.grammars.matcher import words_for
from constrained.processors.functional import apply_penalties
from constrained.processors.grammar_mask import GrammarMaskProcessor
from constrained.processors.penalties import PenaltiesProcessor
from tests.simulate import Request, V1Batch, fake_vllm_config
from tests.test_grammar_bookkeeping import spec_for

WIDTH = 151_936
CAPACITY = 8
SCHEMA = json.dumps({
    "type": "array", "minItems": 1, "maxItems": 3,
    "items": {"type": "object", "additionalProperties": False, "required": ["name", "kind"],
              "properties": {"name": {"type": "string", "maxLength": 12},
                             "kind": {"enum": ["tool", "fruit"]}}},
})  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    return fake_vllm_config(CAPACITY, WIDTH, tiny_model_dir)


def test_lexer_tells_keys_from_values():
    lexer = JsonLexer()
    seen = []
    for char in '[{"name": "a\\"b", "kind": "x"}, "y"]':
        lexer.feed(char.encode())
        seen.append("v" if lexer.in_value else ("k" if lexer.in_string else "."))
    text = "".join(seen)
    assert text == "..kkkkk...vvvvv...kkkkk...vv....vv.."


def reference_content(vocab, compiled, output: list[int]) -> tuple[list[int], bool]:
    """The content tokens of ``output`` and whether the next row is open, from scratch."""
    matcher = compiled.matcher()
    lexer = JsonLexer()
    data = vocab.token_bytes()
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    content = []
    for position in range(len(output) + 1):
        bitmask.zero_()
        matcher.fill(bitmask, 0)
        allowed = int(np.bitwise_count(bitmask[0].numpy().view(np.uint32)).sum())
        opened = open_row(allowed, WIDTH, lexer.in_value)
        if position == len(output):
            return content, opened
        token = output[position]
        strings, was = lexer.strings, lexer.in_value
        lexer.feed(data[token])
        if opened and was and lexer.in_value and lexer.strings == strings:
            content.append(token)
        assert matcher.consume([token])
    raise AssertionError("unreachable")


def request(rng: random.Random, req_id: int, spare: bool) -> Request:
    extra = {"json_schema": SCHEMA, "frequency_penalty": 1.5, "presence_penalty": 0.5,
             "repetition_penalty": 1.3}  # fmt: skip
    if not spare:
        extra["penalize_structure"] = True
    params = SamplingParams(temperature=1.0, max_tokens=10_000, extra_args=extra)
    return Request(req_id, params, [rng.randrange(1000) for _ in range(3)])


def test_open_rows_count_content_only_and_structure_rows_keep_their_bits(vocab, config):
    rng = random.Random(0)
    torch.manual_seed(0)
    grammar = GrammarMaskProcessor(config, torch.device("cpu"), False)
    penalties = PenaltiesProcessor(config, torch.device("cpu"), False)
    compiled = compile_now(spec_for({"json_schema": SCHEMA}), vocab)
    batch = V1Batch(CAPACITY, rng)
    next_id, spared_rows, open_rows, content_seen = 0, 0, 0, 0
    for step in range(40):
        new = [request(rng, next_id + i, spare=(next_id + i) % 4 != 0)
               for i in range(rng.randint(0, 2))]  # fmt: skip
        next_id += len(new)
        update = batch.step(new)
        grammar.update_state(update)
        penalties.update_state(update)
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), WIDTH) * 3
        masked = grammar.apply(logits.clone())
        out = penalties.apply(masked.clone())
        for i, req in enumerate(batch.rows):
            extra = req.params.extra_args
            if extra.get("penalize_structure"):
                counted, opened = list(req.output), True
            else:
                counted, opened = reference_content(vocab, compiled, req.output)
                content_seen += len(counted)
            if not opened:
                assert torch.equal(out[i], masked[i]), f"step {step}: structure row {i} changed"
                spared_rows += 1
            else:
                want = masked[i : i + 1].clone()
                output_counts = torch.bincount(torch.tensor(counted, dtype=torch.long),
                                               minlength=WIDTH)[None]  # fmt: skip
                prompt_counts = torch.bincount(torch.tensor(req.prompt), minlength=WIDTH)[None]
                apply_penalties(want, output_counts, prompt_counts, torch.tensor([1.3]),
                                torch.tensor([1.5]), torch.tensor([0.5]))  # fmt: skip
                diff = torch.nonzero(out[i] != want[0]).flatten()[:5].tolist()
                assert torch.equal(out[i], want[0]), (
                    f"step {step}: open row {i} {extra.get('penalize_structure')} {counted} "
                    f"{req.output} {req.prompt} {diff} {out[i][diff]} {want[0][diff]} "
                    f"{masked[i][diff]}"
                )
                open_rows += 1
            token = int(torch.argmax(out[i] - torch.log(-torch.log(torch.rand(WIDTH)))))
            req.done = token == vocab.eos_token_id
            req.output.append(token)
    assert spared_rows > 50 and open_rows > 20 and content_seen > 10, (spared_rows, open_rows)
