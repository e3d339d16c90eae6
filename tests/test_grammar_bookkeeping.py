"""The grammar mask under simulated V1 and V2 batches: every row, every step, exactly the
tokens a fresh reference matcher allows after that request's output (and drafts)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams

from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.matcher import words_for
from constrained.processors.grammar_mask import GrammarMaskProcessor
from tests.simulate import Request, V1Batch, fake_req_states, v2_context

WIDTH = 151_936
CAPACITY = 12
CONSTRAINTS = [
    {"regex": "[0-9]{2,5}"},
    {"regex": "(yes|no)!"},
    {"grammar": 'root ::= "[" ("a" | "bb") ("," ("a" | "bb"))* "]"', "grammar_backend": "xgrammar"},
    {"json_schema": json.dumps({"type": "object", "properties": {"k": {"enum": [1, 22]}},
                                "required": ["k"], "additionalProperties": False})},
    {"json_schema": json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 2}),
     "grammar_backend": "outlines"},
    {"regex": "[a-c]{1,3}", "grammar_backend": "xgrammar"},
]  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=CAPACITY),
        model_config=SimpleNamespace(
            get_vocab_size=lambda: WIDTH, tokenizer=tiny_model_dir, model=tiny_model_dir
        ),
        speculative_config=None,
    )


class Reference:
    """A fresh matcher per check: the allowed set after ``tokens``, from first principles."""

    def __init__(self, vocab) -> None:
        self.vocab = vocab
        self.compiled: dict = {}

    def allowed(self, extra: dict, tokens: list[int]) -> torch.Tensor:
        kind = next(k for k in ("regex", "grammar", "json_schema") if k in extra)
        spec = GrammarSpec(kind, extra[kind], extra.get("grammar_backend", "auto"))
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
    extra = dict(rng.choice(CONSTRAINTS)) if rng.random() < 0.75 else {}
    params = SamplingParams(temperature=1.0, extra_args=extra or None)
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


def test_v2_rows_and_draft_rows_get_exactly_the_reference_mask(vocab, config):
    rng = random.Random(3)
    torch.manual_seed(3)
    states = fake_req_states(CAPACITY, WIDTH)
    proc = GrammarMaskProcessor(config, states)
    reference = Reference(vocab)
    live: dict[int, Request] = {}
    next_id, checked, draft_rows = 0, 0, 0
    for step in range(80):
        for slot in list(live):
            if rng.random() < 0.08:
                del live[slot]
        free = [s for s in range(CAPACITY) if s not in live]
        for slot in rng.sample(free, min(len(free), rng.randint(0, 2))):
            req = random_request(rng, next_id, vocab)
            next_id += 1
            live[slot] = req
            states.admit(slot, req.prompt, req.output)
            proc.add_request(slot, req.params)
        proc.apply_staged_writes()
        if not live:
            continue
        order = rng.sample(sorted(live), len(live))
        drafts = []
        for slot in order:  # drafts: some follow the constraint, some are junk
            req, d = live[slot], []
            for _ in range(rng.choice([0, 0, 1, 2])):
                extra = req.params.extra_args
                if extra and rng.random() < 0.7:
                    ok = reference.allowed(extra, req.output + d).nonzero().flatten().tolist()
                    d.append(rng.choice(ok))
                else:
                    d.append(rng.randrange(WIDTH))
            drafts.append(d)
        last = [(live[s].prompt + live[s].output)[-1] for s in order]
        lengths = [len(live[s].prompt) + len(live[s].output) for s in order]
        ctx, expanded, local = v2_context(order, drafts, last, lengths)
        logits = torch.randn(len(expanded), WIDTH)
        out = proc.apply(logits.clone(), ctx)
        draft_of = dict(zip(order, drafts, strict=True))
        for r, slot in enumerate(expanded):
            req = live[slot]
            extra = req.params.extra_args
            if not extra:
                assert torch.equal(out[r], logits[r])
                continue
            seen = req.output + draft_of[slot][: local[r]]
            want = reference.allowed(extra, seen)
            assert torch.equal(out[r] > float("-inf"), want), f"step {step} row {r} {seen}"
            checked += 1
            draft_rows += local[r] > 0
        row = 0
        for slot, d in zip(order, drafts, strict=True):  # a rejection sampler, greedily
            accepted = []
            for k in range(len(d) + 1):
                token = sample(out[row + k], rng)
                accepted.append(token)
                if k == len(d) or d[k] != token:
                    break
            row += len(d) + 1
            live[slot].output.extend(accepted)
            states.commit(slot, accepted)
    assert checked > 200 and draft_rows > 30
