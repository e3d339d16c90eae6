"""Processors driven by simulated V1 batch updates, against a per-request reference, every row
of every step (thousands of steps). V2 runs on vLLM's real sampler code: ``tests/v2_real/``."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.model_executor.layers.utils import apply_penalties as vllm_apply_penalties
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from constrained.processors import LogitBiasProcessor, MinPProcessor, PenaltiesProcessor
from tests.simulate import Request, V1Batch, fake_req_states, fake_vllm_config

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
    if rng.random() < 0.6:
        extra["repetition_penalty"] = rng.choice([1.0, 0.7, 1.3, 2.0])
        extra["frequency_penalty"] = rng.choice([0.0, -1.5, 0.5, 2.0])
        extra["presence_penalty"] = rng.choice([0.0, -0.5, 1.0])
        extra["penalty_last_n"] = rng.choice([0, 0, 1, 3, 8])
        extra["penalty_scope"] = rng.choice(["default", "output", "prompt_and_output"])
    temperature = rng.choice([0.0, 0.5, 1.0, 1.7])
    return SamplingParams(temperature=temperature, extra_args=extra or None)


def penalty_reference(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """vLLM's own ``apply_penalties`` on the tokens the request's scope and window count."""
    extra = req.params.extra_args or {}
    window = extra.get("penalty_last_n") or 0
    scope = extra.get("penalty_scope") or "default"
    sequence = req.prompt + req.output
    start = max(0, len(sequence) - window) if window else 0
    prompt = [t for pos, t in enumerate(sequence) if start <= pos < len(req.prompt)]
    output = [t for pos, t in enumerate(sequence) if pos >= max(start, len(req.prompt))]
    if scope == "output":
        prompt = []
    elif scope == "prompt_and_output":
        prompt, output = [], prompt + output
    as_row = lambda ids: torch.tensor([ids or [VOCAB]], dtype=torch.int64)  # noqa: E731
    return vllm_apply_penalties(
        logits.unsqueeze(0),
        as_row(prompt),
        as_row(output),
        torch.tensor([extra.get("presence_penalty", 0.0)]),
        torch.tensor([extra.get("frequency_penalty", 0.0)]),
        torch.tensor([extra.get("repetition_penalty", 1.0)]),
    )[0]


def reference(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """One request's expected logits under V1: bias, vLLM's penalties, then min-p in float64
    (after temperature, so on these logits as they are)."""
    params = req.params
    out = logits.clone()
    extra = params.extra_args or {}
    for token, bias in (extra.get("logit_bias") or {}).items():
        out[token] += bias
    if "repetition_penalty" in extra:
        out = penalty_reference(out, req)
    min_p = extra.get("min_p") or 0.0
    if min_p and params.temperature >= 1e-5:
        probs = torch.softmax(out.double(), dim=-1)
        out[probs < min_p * probs.max()] = -math.inf
    return out


def assert_rows_equal(actual: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    """Bit-identical, except a token or two exactly at the min-p threshold, where float32
    (ours, in logit space) and float64 (the reference, in probability space) may round apart."""
    differ = actual.view(torch.int32) != expected.view(torch.int32)
    if not bool(differ.any()):
        return
    one_masked = torch.isinf(actual) != torch.isinf(expected)
    assert bool(one_masked[differ].all()), f"{where}: values differ at {differ.nonzero().tolist()}"
    assert int(differ.sum()) <= 2, f"{where}: {int(differ.sum())} tokens masked differently"


def make_processors():
    cfg = fake_vllm_config(CAPACITY, VOCAB)
    classes = (LogitBiasProcessor, PenaltiesProcessor, MinPProcessor)
    return [cls(cfg, torch.device("cpu"), False) for cls in classes]


def run_chain(processors, logits):
    for proc in processors:
        logits = proc.apply(logits)
    return logits


def assert_slot_bookkeeping(procs) -> None:
    """The active count matches the active rows, and every inactive row holds its columns'
    fill values and no payload (what lets a step with no active slot skip the table)."""
    for proc in procs:
        slots = proc.slots
        assert slots.num_active == int(slots.active.sum())
        idle = ~slots.active
        assert all(slots.payload[i] is None for i in idle.nonzero()[0])
        for name, col in slots.columns.items():
            rows = slots.host[name][torch.from_numpy(idle)]
            assert bool((rows == col.fill).all()), (type(proc).__name__, name)


@pytest.mark.parametrize(("seed", "plain_share"), [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.9)])
def test_v1_random_batches_match_reference(seed: int, plain_share: float) -> None:
    """``plain_share``: the share of requests with no option of ours (at 0.9 the batch often
    holds none of ours, and requests join, leave and move while no slot is active)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    procs = make_processors()
    batch = V1Batch(CAPACITY, rng)
    next_id = 0
    for step in range(1500):
        new = []
        for _ in range(rng.randint(0, 3)):
            params = random_params(rng)
            if rng.random() < plain_share:
                params = SamplingParams(temperature=params.temperature)
            new.append(Request(next_id, params, [rng.randrange(VOCAB) for _ in range(5)]))
            next_id += 1
        update = batch.step(new)
        for proc in procs:
            proc.update_state(update)
        assert_slot_bookkeeping(procs)
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), VOCAB) * 3
        expected = torch.stack([reference(logits[i], req) for i, req in enumerate(batch.rows)])
        # V1 applies min-p after temperature; the reference above uses T = 1 for V1 rows too.
        actual = run_chain(procs, logits.clone())
        for i, req in enumerate(batch.rows):
            assert_rows_equal(actual[i], expected[i], f"step {step} row {i} req {req.req_id}")
            req.output.append(rng.randrange(VOCAB))
    assert next_id > 1000


def test_rows_without_options_are_untouched_bit_for_bit() -> None:
    procs = make_processors()
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


def test_v2_count_table_is_allocated_when_the_processor_is_built() -> None:
    """vLLM sizes the KV cache from the memory in use after building the model runner (and
    its processors): a table allocated later is memory vLLM did not account for."""
    states = fake_req_states(CAPACITY, VOCAB)
    proc = PenaltiesProcessor(SimpleNamespace(speculative_config=None), states)
    table = proc.counts.counts.counts
    assert table.shape == (CAPACITY, VOCAB) and table.dtype == torch.int32
    assert table.device == states.device
