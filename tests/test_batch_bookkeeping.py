"""Processors driven by simulated V1 batch updates and V2 contexts, against a per-request
reference, every row of every step (thousands of steps)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from constrained.processors import LogitBiasProcessor, MinPProcessor
from tests.simulate import Request, V1Batch, fake_req_states, fake_vllm_config, v2_context

VOCAB = 257
CAPACITY = 12


def random_params(rng: random.Random) -> SamplingParams:
    extra: dict = {}
    if rng.random() < 0.5:
        extra["logit_bias"] = {
            rng.randrange(VOCAB): rng.uniform(-100, 100) for _ in range(rng.randint(1, 9))
        }
    if rng.random() < 0.5:
        extra["min_p"] = rng.choice([0.0, 0.05, 0.3, 1.0, rng.random()])
    temperature = rng.choice([0.0, 0.5, 1.0, 1.7])
    return SamplingParams(temperature=temperature, extra_args=extra or None)


def reference(logits: torch.Tensor, params: SamplingParams, runner: str) -> torch.Tensor:
    """One request's expected logits, written the slow, obvious way (float64 min-p)."""
    out = logits.clone()
    extra = params.extra_args or {}
    for token, bias in (extra.get("logit_bias") or {}).items():
        out[token] += bias
    min_p = extra.get("min_p") or 0.0
    if min_p and params.temperature >= 1e-5:
        temperature = params.temperature if runner == "v2" else 1.0
        probs = torch.softmax(out.double() / temperature, dim=-1)
        out[probs < min_p * probs.max()] = -math.inf
    return out


def assert_rows_equal(actual: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    # Exact bits, except at the min-p boundary where float32 and float64 may round apart.
    same = actual.view(torch.int32) == expected.view(torch.int32)
    if bool(same.all()):
        return
    finite = torch.isfinite(expected) & torch.isfinite(actual)
    assert bool((same | finite).all()), f"{where}: a token masked in one and not the other"
    assert torch.allclose(actual[finite], expected[finite]), where


def make_processors(runner: str):
    if runner == "v1":
        cfg = fake_vllm_config(CAPACITY, VOCAB)
        return [cls(cfg, torch.device("cpu"), False) for cls in (LogitBiasProcessor, MinPProcessor)]
    states = fake_req_states(CAPACITY, VOCAB)
    return [cls(None, states) for cls in (LogitBiasProcessor, MinPProcessor)]


def run_chain(processors, logits, ctx=None):
    for proc in processors:
        logits = proc.apply(logits, ctx) if ctx is not None else proc.apply(logits)
    return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v1_random_batches_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    procs = make_processors("v1")
    batch = V1Batch(CAPACITY, rng)
    next_id = 0
    for step in range(1500):
        new = []
        for _ in range(rng.randint(0, 3)):
            new.append(
                Request(next_id, random_params(rng), [rng.randrange(VOCAB) for _ in range(5)])
            )
            next_id += 1
        update = batch.step(new)
        for proc in procs:
            proc.update_state(update)
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), VOCAB) * 3
        expected = torch.stack(
            [reference(logits[i], req.params, "v1") for i, req in enumerate(batch.rows)]
        )
        # V1 applies min-p after temperature; the reference above uses T = 1 for V1 rows too.
        actual = run_chain(procs, logits.clone())
        for i, req in enumerate(batch.rows):
            assert_rows_equal(actual[i], expected[i], f"step {step} row {i} req {req.req_id}")
            req.output.append(rng.randrange(VOCAB))
    assert next_id > 1000


@pytest.mark.parametrize("seed", [0, 1])
def test_v2_slots_and_speculative_rows_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    procs = make_processors("v2")
    live: dict[int, Request] = {}  # slot -> request
    next_id = 0
    for step in range(1500):
        for slot in list(live):
            if rng.random() < 0.15:
                del live[slot]  # V2 frees slots silently; the next add must overwrite them
        free = [s for s in range(CAPACITY) if s not in live]
        for slot in rng.sample(free, min(len(free), rng.randint(0, 3))):
            req = Request(next_id, random_params(rng), [])
            next_id += 1
            live[slot] = req
            for proc in procs:
                proc.add_request(slot, req.params)
        for proc in procs:
            proc.apply_staged_writes()
        if not live:
            continue
        order = rng.sample(sorted(live), len(live))
        drafts = [rng.choice([0, 0, 1, 3]) for _ in order]
        ctx, expanded = v2_context(order, drafts)
        logits = torch.randn(len(expanded), VOCAB) * 3
        expected = torch.stack(
            [reference(logits[r], live[s].params, "v2") for r, s in enumerate(expanded)]
        )
        actual = run_chain(procs, logits.clone(), ctx)
        for r, slot in enumerate(expanded):
            assert_rows_equal(actual[r], expected[r], f"step {step} row {r} slot {slot}")


def test_rows_without_options_are_untouched_bit_for_bit() -> None:
    procs = make_processors("v1")
    plain = SamplingParams(temperature=1.0)
    biased = SamplingParams(temperature=1.0, extra_args={"logit_bias": {0: 5.0}, "min_p": 0.5})
    update = BatchUpdate(2, [], [(0, plain, [1], []), (1, biased, [1], [])], [])
    for proc in procs:
        proc.update_state(update)
    logits = torch.randn(2, VOCAB)
    logits[0, 0] = -0.0  # sign of zero must survive the neutral padding
    logits[0, 1] = -math.inf
    logits[1, 0] = 10.0
    before = logits.clone()
    out = run_chain(procs, logits)
    assert torch.equal(out[0].view(torch.int32), before[0].view(torch.int32))
    assert out[1, 0] == 15.0  # the other row in the same batch was biased...
    assert torch.isinf(out[1, 1:]).all()  # ...and min-p 0.5 kept only its top token
