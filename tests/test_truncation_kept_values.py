"""Top-n-sigma, typical-p and XTC only ever *remove* tokens: every logit they keep is bitwise
the logit they were given, on adversarial rows (ties, a few distinct values, one finite token,
huge and tiny scales, mostly masked rows) and through all three wirings: V2's (``TensorMask``,
rows mapped to slots through ``expanded_idx_mapping`` with drafts repeating a slot), V1's
host rows and V1's tensor mask.

Why this file exists (issue #28): on CUDA, vLLM's V2 real-sampler scenario
``truncation_samplers`` reported "kept values changed" at its first sampler row with
``temperature = 0.7``. The samplers do not touch kept values (asserted here); the difference is
vLLM's ``_temperature_kernel``, which divides with Triton's ``/`` (not IEEE-rounded on NVIDIA:
``div.full.f32``, up to 2 ulp), against a reference that divides exactly.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from constrained.processors.top_n_sigma import TopNSigmaProcessor
from constrained.processors.truncation import HostRowsMask, TensorMask
from constrained.processors.typical_p import TypicalPProcessor
from constrained.processors.xtc import XtcProcessor
from tests.simulate import fake_req_states, fake_vllm_config

PROCESSORS = (TopNSigmaProcessor, TypicalPProcessor, XtcProcessor)  # vLLM's order
CAPACITY = 8
VOCAB = 301
WIRINGS = ("v2", "v1_host_rows", "v1_tensor")


def adversarial_row(rng: random.Random, vocab: int) -> torch.Tensor:
    """One float32 row of a kind chosen to stress bounds computed from the row itself."""
    kind = rng.choice(["ties", "two_levels", "constant", "single", "scaled", "log_probs", "spiky"])
    if kind == "ties":  # few distinct values: ties at every boundary
        row = torch.randint(-4, 5, (vocab,)).float() * rng.choice([0.5, 0.1, 3.0])
    elif kind == "two_levels":
        row = torch.full((vocab,), rng.uniform(-5, 5))
        row[torch.randperm(vocab)[: rng.randint(1, 6)]] += rng.choice([0.1, 1.0, 20.0])
    elif kind == "constant":
        row = torch.full((vocab,), rng.uniform(-50, 50))
    elif kind == "single":  # one finite token
        row = torch.full((vocab,), -math.inf)
        row[rng.randrange(vocab)] = rng.uniform(-5, 5)
    elif kind == "scaled":
        row = torch.randn(vocab) * rng.choice([1e-30, 1e-6, 1e-3, 30.0, 1e4])
    elif kind == "log_probs":  # log of a distribution with repeated probabilities
        levels = torch.tensor([0.3, 0.1, 0.01, 1e-4, 1e-9])
        row = levels[torch.randint(len(levels), (vocab,))].log()
    else:
        row = torch.randn(vocab) * rng.choice([0.5, 2.0, 4.0])
        row[torch.randint(vocab, (rng.randint(0, 4),))] += rng.uniform(2, 10)
    if kind != "single" and rng.random() < 0.3:  # a grammar mask
        row[torch.rand(vocab) < rng.choice([0.5, 0.99])] = -math.inf
        if not bool(torch.isfinite(row).any()):
            row[rng.randrange(vocab)] = 0.0
    return row


def sampler_params(rng: random.Random) -> SamplingParams:
    """Mostly aggressive settings (small masses, small n, XTC always on), some plain/greedy."""
    if rng.random() < 0.1:
        return SamplingParams(temperature=1.0)
    extra: dict = {}
    if rng.random() < 0.6:
        extra["top_n_sigma"] = rng.choice([0.01, 0.5, 1.0, 3.0])
    if rng.random() < 0.6:
        extra["typical_p"] = rng.choice([0.01, 0.2, 0.5, 0.9, 0.999])
    if rng.random() < 0.6:
        extra["xtc_probability"] = rng.choice([1.0, 0.5])
        extra["xtc_threshold"] = rng.choice([0.0, 0.01, 0.1, 0.3, 0.5])
    temperature = rng.choice([1.0, 0.7, 0.7, 0.0])
    return SamplingParams(temperature=temperature, seed=rng.randrange(2**32), extra_args=extra)


def build(wiring: str) -> list:
    if wiring == "v2":
        config = SimpleNamespace(speculative_config=None, model_config=SimpleNamespace(seed=0))
        return [cls(config, fake_req_states(CAPACITY, VOCAB)) for cls in PROCESSORS]
    procs = [
        cls(fake_vllm_config(CAPACITY, VOCAB), torch.device("cpu"), False) for cls in PROCESSORS
    ]
    for proc in procs:
        proc.mask = (HostRowsMask if wiring == "v1_host_rows" else TensorMask)(proc)
    return procs


def admit(procs: list, wiring: str, params: list[SamplingParams]) -> None:
    if wiring == "v2":
        for proc in procs:
            for slot, p in enumerate(params):
                proc.add_request(slot, p)
            proc.apply_staged_writes()
        return
    added = [(slot, p, [1, 2, 3], []) for slot, p in enumerate(params)]
    update = BatchUpdate(batch_size=len(params), removed=[], added=added, moved=[])
    for proc in procs:
        proc.update_state(update)


def apply_all(procs: list, wiring: str, logits: torch.Tensor, row_slots: list[int]) -> torch.Tensor:
    """The processors in vLLM's order, the way the wiring's runner calls them."""
    ctx = None
    if wiring == "v2":
        ctx = SimpleNamespace(
            idx_mapping_np=np.unique(np.array(row_slots, dtype=np.int64)),
            expanded_idx_mapping=torch.tensor(row_slots, dtype=torch.int64),
            pos=torch.tensor([10 + i for i in range(len(row_slots))], dtype=torch.int32),
        )
    for proc in procs:
        logits = proc.apply(logits, ctx)
    return logits


def check_row(where: str, before: torch.Tensor, after: torch.Tensor, params: SamplingParams) -> int:
    """Asserts the invariants on one row; returns how many finite tokens were removed."""
    kept = torch.isfinite(after)
    removed = torch.isfinite(before) & ~kept
    assert torch.equal(after[kept].view(torch.int32), before[kept].view(torch.int32)), (
        f"{where}: kept values changed"
    )
    assert bool((after[~kept] == -math.inf).all()), f"{where}: a removed token is not -inf"
    assert bool(kept.any()), f"{where}: nothing left to sample"
    if not params.extra_args or params.temperature < 1e-5:
        assert not bool(removed.any()), f"{where}: a plain or greedy row changed"
    # An interval of the row's values: no removed token lies between two kept ones, so tied
    # tokens are kept or removed together.
    low, high = after[kept].min(), after[kept].max()
    inside = removed & (before >= low) & (before <= high)
    assert not bool(inside.any()), (
        f"{where}: removed {before[inside][:3].tolist()} in [{low}, {high}]"
    )
    return int(removed.sum())


@pytest.mark.parametrize("wiring", WIRINGS)
def test_kept_logits_are_bitwise_the_input(wiring: str) -> None:
    rng = random.Random(28)
    torch.manual_seed(28)
    removed = rows = 0
    for batch in range(60):
        params = [sampler_params(rng) for _ in range(CAPACITY)]
        procs = build(wiring)
        admit(procs, wiring, params)
        if wiring == "v2":  # drafts: a slot owns several consecutive rows
            row_slots = [s for s in range(CAPACITY) for _ in range(rng.choice([1, 1, 2, 3]))]
        else:
            row_slots = list(range(CAPACITY))
        logits = torch.stack([adversarial_row(rng, VOCAB) for _ in row_slots])
        got = apply_all(procs, wiring, logits.clone(), row_slots)
        for i, slot in enumerate(row_slots):
            where = f"{wiring} batch {batch} row {i} {params[slot].extra_args}"
            removed += check_row(where, logits[i], got[i], params[slot])
            rows += 1
    assert rows >= 480 and removed > 20_000  # the samplers did remove tokens


def test_v2_wiring_leaves_the_logits_object_and_other_rows_alone() -> None:
    """V2 edits in place through one ``masked_fill_`` per side: the same tensor comes back,
    and rows of requests without a sampler (neutral bounds) are bitwise unchanged, even
    when they hold ties, masks or extreme values."""
    rng = random.Random(5)
    torch.manual_seed(5)
    params = [
        sampler_params(rng) if s % 2 else SamplingParams(temperature=1.0) for s in range(CAPACITY)
    ]
    procs = build("v2")
    admit(procs, "v2", params)
    row_slots = [s for s in range(CAPACITY) for _ in range(2)]
    logits = torch.stack([adversarial_row(rng, VOCAB) for _ in row_slots])
    work = logits.clone()
    got = apply_all(procs, "v2", work, row_slots)
    assert got.data_ptr() == work.data_ptr()
    for i, slot in enumerate(row_slots):
        if slot % 2 == 0:
            assert torch.equal(got[i].view(torch.int32), logits[i].view(torch.int32)), i
