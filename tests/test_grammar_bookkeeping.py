"""The grammar mask under simulated V1 batches: every row, every step, exactly the tokens a
fresh reference matcher allows after that request's output. V2 (drafts, placeholders, chunked
prefill...) runs on vLLM's real sampler code: ``tests/v2_real/``."""

from __future__ import annotations

import json
import random

import pytest
import torch
from vllm import SamplingParams

from constrained.admission import spec_of
from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.matcher import words_for
from constrained.options import Options
from constrained.processors.grammar_mask import GrammarMaskProcessor
from tests.simulate import Request, V1Batch, fake_vllm_config

WIDTH = 151_936
CAPACITY = 12
# One call, as a forced tool call is: <tool_call> (a special token), JSON, </tool_call>.
TOOL_CALL = json.dumps({"type": "structural_tag", "format": {
    "type": "tags_with_separator", "separator": "", "at_least_one": True,
    "stop_after_first": True, "tags": [{
        "type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
        "content": {"type": "json_schema", "json_schema": {
            "type": "object", "properties": {"n": {"enum": [1, 22]}}, "required": ["n"],
            "additionalProperties": False}},
    }]}})  # fmt: skip
CONSTRAINTS = [
    {"regex": "[0-9]{2,5}"},
    {"regex": "(yes|no)!"},
    {"grammar": 'root ::= "[" ("a" | "bb") ("," ("a" | "bb"))* "]"', "grammar_backend": "xgrammar"},
    {"json_schema": json.dumps({"type": "object", "properties": {"k": {"enum": [1, 22]}},
                                "required": ["k"], "additionalProperties": False})},
    {"json_schema": json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 2}),
     "grammar_backend": "outlines"},
    {"regex": "[a-c]{1,3}", "grammar_backend": "xgrammar"},
    {"structural_tag": TOOL_CALL},
]  # fmt: skip
# With uniqueItems and contains, checked by our matcher over llguidance's (checked_matcher.py).
GRAMMAR_CONSTRAINTS = [
    *CONSTRAINTS,
    {"json_schema": json.dumps({"type": "array", "items": {"enum": [1, 2, 3, 22]},
                                "uniqueItems": True, "contains": {"const": 22}, "maxItems": 4})},
]  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    return fake_vllm_config(CAPACITY, WIDTH, tiny_model_dir)


def spec_for(extra: dict) -> GrammarSpec:
    """The spec a request's constraint compiles as (admission's own ``spec_of``)."""
    return spec_of(Options.from_extra_args(extra))


def kind_of(extra: dict) -> str:
    return next(k for k in ("regex", "grammar", "json_schema", "structural_tag") if k in extra)


class Reference:
    """A fresh matcher per check: the allowed set after ``tokens``, from first principles."""

    def __init__(self, vocab) -> None:
        self.vocab = vocab
        self.compiled: dict = {}

    def allowed(self, extra: dict, tokens: list[int]) -> torch.Tensor:
        spec = spec_for(extra)
        if spec not in self.compiled:
            self.compiled[spec] = compile_now(spec, self.vocab)
        matcher = self.compiled[spec].matcher()
        bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
        eos = self.vocab.eos_token_id
        ended = eos in tokens
        if ended or not matcher.consume(tokens):
            bitmask[0, eos // 32] = 1 << (eos % 32)
        else:
            matcher.fill(bitmask, 0)
        bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        return bits.flatten()[:WIDTH].bool()


def random_request(rng: random.Random, req_id: int, vocab) -> Request:
    extra = dict(rng.choice(GRAMMAR_CONSTRAINTS)) if rng.random() < 0.75 else {}
    # A budget never reached: these rows must equal the grammar's mask (closing narrows it:
    # tests/test_budget_closing.py).
    params = SamplingParams(temperature=1.0, max_tokens=10_000, extra_args=extra or None)
    return Request(req_id, params, [rng.randrange(1000) for _ in range(3)])


def sample(logits_row: torch.Tensor, rng: random.Random) -> int:
    noise = -torch.log(-torch.log(torch.rand(logits_row.shape[0]).clamp_min(1e-9)))
    return int(torch.argmax(logits_row + noise))


@pytest.mark.parametrize("seed", [0])
def test_v1_rows_get_exactly_the_reference_mask(vocab, config, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
    reference = Reference(vocab)
    batch = V1Batch(CAPACITY, rng)
    next_id, checked, finished = 0, 0, 0
    for step in range(100):
        new = [random_request(rng, next_id + i, vocab) for i in range(rng.randint(0, 2))]
        next_id += len(new)
        proc.update_state(batch.step(new))
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), WIDTH)
        out = proc.apply(logits.clone())
        for i, req in enumerate(batch.rows):
            extra = req.params.extra_args
            if not extra:
                assert torch.equal(out[i], logits[i]), f"step {step}: plain row {i} changed"
            else:
                want = reference.allowed(extra, req.output)
                got = out[i] > float("-inf")
                assert torch.equal(got, want), f"step {step} row {i} {extra} {req.output}"
                checked += 1
            token = sample(out[i], rng)
            finished += token == vocab.eos_token_id and bool(extra)
            req.output.append(token)
    assert checked > 300 and finished > 5


@pytest.mark.parametrize("threads", [1, 2])
def test_xgrammar_batched_fill_writes_each_rows_own_mask(vocab, monkeypatch, threads):
    """``XGrammarMatcher.fill_many`` (one call of xgrammar's batch fill, in one thread or
    several) writes exactly the rows ``fill`` writes one by one: matchers at different
    points, one finished by end-of-sequence, one failed, rows out of order, over a bitmask's
    stale contents."""
    from constrained.grammars import xgrammar_backend

    if threads > 1:
        monkeypatch.setattr(xgrammar_backend, "PARALLEL_ABOVE", 1)
        monkeypatch.setattr(xgrammar_backend, "FILL_THREADS", threads)
    schema = json.loads(CONSTRAINTS[3]["json_schema"])
    grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema), "xgrammar"), vocab)
    tokens = vocab.hf_tokenizer.encode('{"k":22}', add_special_tokens=False)
    matchers = []
    for n in range(len(tokens) + 1):
        matcher = grammar.matcher()
        assert matcher.consume(tokens[:n])
        matchers.append(matcher)
    ended = grammar.matcher()
    assert ended.consume([*tokens, vocab.eos_token_id]) and ended.bottom.inner.is_terminated()
    failed = grammar.matcher()
    assert not failed.consume(vocab.hf_tokenizer.encode("[", add_special_tokens=False))
    matchers += [ended, failed]
    rows = list(range(len(matchers)))
    random.Random(0).shuffle(rows)
    pairs = list(zip(matchers, rows, strict=True))
    want = torch.zeros(len(rows) + 2, words_for(WIDTH), dtype=torch.int32)
    for matcher, row in pairs:
        matcher.fill(want, row)
    bitmask = torch.full_like(want, -1)
    type(matchers[0]).fill_many(pairs, bitmask)
    assert torch.equal(bitmask[rows], want[rows])
