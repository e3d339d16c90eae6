"""Top-n-sigma, typical-p and XTC against per-request references written from their published
definitions (llama.cpp's samplers), on simulated V1 batches, every row of every step; both
mask strategies (host rows on CPU, tensor). V2 runs on vLLM's real sampler: ``tests/v2_real/``."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch
from vllm import SamplingParams

from constrained import Options
from constrained.options import OptionError
from constrained.processors.top_n_sigma import TopNSigmaProcessor
from constrained.processors.truncation import HostRowsMask, TensorMask
from constrained.processors.truncation_math import (
    Scratch,
    host_kernel,
    mask_outside_rows,
    mask_outside_rows_native,
    typical_bounds,
    typical_bounds_native,
    typical_bounds_on_host,
    uniform_hash,
)
from constrained.processors.typical_p import TypicalPProcessor
from constrained.processors.xtc import XtcProcessor, _seed32
from tests.simulate import Request, V1Batch, fake_vllm_config
from tests.v2_real import run_cases

VOCAB = 257
CAPACITY = 12
NEAR = 1e-4  # a token this close to a boundary may fall either side (float32 vs float64)


class HostRowsMaskNumpy(HostRowsMask):
    """``HostRowsMask`` where no C kernel compiled (or ``CONSTRAINED_HOST_KERNELS=0``): the
    torch / NumPy bounds and ``threshold_`` mask."""

    def __init__(self, processor) -> None:
        super().__init__(processor)
        processor.host_kernel = None


STRATEGIES = [HostRowsMask, HostRowsMaskNumpy, TensorMask]


# ---- references: one request, float64, straight from the definitions ---------------------


def top_n_sigma_reference(logits: list[float], n: float) -> tuple[set[int], list[float]]:
    """llama.cpp ``llama_sampler_top_n_sigma_apply``: mean and std over finite logits."""
    finite = [x for x in logits if x > -math.inf]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((x - mean) ** 2 for x in finite) / len(finite))
    cut = max(finite) - n * std
    kept = {i for i, x in enumerate(logits) if x > -math.inf and x >= cut}
    return kept, [x - cut for x in logits]  # margin: how far each token is from the cut


def typical_reference(logits: list[float], mass: float) -> tuple[set[int], list[float]]:
    """llama.cpp ``llama_sampler_typical_apply``: sort by |-log p - H|, keep until cum > p."""
    top = max(logits)
    z = sum(math.exp(x - top) for x in logits if x > -math.inf)
    lse = top + math.log(z)
    probs = [math.exp(x - lse) if x > -math.inf else 0.0 for x in logits]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    score = [abs(-math.log(p) - entropy) if p > 0 else math.inf for p in probs]
    order = sorted((i for i in range(len(logits)) if probs[i] > 0), key=lambda i: score[i])
    kept, total = set(), 0.0
    for i in order:
        kept.add(i)
        total += probs[i]
        if total > mass:
            break
    boundary = max(score[i] for i in kept)
    return kept, [boundary - s for s in score]


def xtc_reference(logits: list[float], threshold: float, apply: bool) -> tuple[set[int], list]:
    """llama.cpp ``llama_sampler_xtc_apply``: sorted by p, drop all above the last p >= t."""
    finite = [i for i, x in enumerate(logits) if x > -math.inf]
    if not apply:
        return set(finite), [math.inf] * len(logits)
    top = max(logits)
    z = sum(math.exp(logits[i] - top) for i in finite)
    probs = {i: math.exp(logits[i] - top) / z for i in finite}
    order = sorted(finite, key=lambda i: -probs[i])
    last = 0
    for k, i in enumerate(order):
        if probs[i] >= threshold:
            last = k
        else:
            break
    kept = set(order[last:]) if last > 0 else set(finite)
    return kept, [abs(probs.get(i, 0.0) - threshold) * 1e3 for i in range(len(logits))]


def reference(
    logits: torch.Tensor, params: SamplingParams, seed: int, position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected logits for one row after top-n-sigma, typical-p and XTC, in that order, and
    the tokens near a boundary (allowed to differ). ``seed`` is the request's 32-bit seed
    and ``position`` that of the token being sampled (XTC's draw)."""
    extra = params.extra_args or {}
    out = logits.clone()
    near = torch.zeros(len(out), dtype=torch.bool)
    if params.temperature < 1e-5:
        return out, near
    steps = []
    if "top_n_sigma" in extra:
        steps.append(lambda v: top_n_sigma_reference(v, extra["top_n_sigma"]))
    if extra.get("typical_p", 1.0) < 1.0:
        steps.append(lambda v: typical_reference(v, extra["typical_p"]))
    if extra.get("xtc_probability"):
        draw = float(uniform_hash(torch.tensor([seed]), torch.tensor([position]))[0])
        apply = draw < extra["xtc_probability"]
        threshold = extra.get("xtc_threshold", 0.1)
        steps.append(lambda v: xtc_reference(v, threshold, apply))
    for step in steps:
        kept, margin = step(out.double().tolist())
        near |= torch.tensor([abs(m) < NEAR for m in margin])
        drop = torch.ones(len(out), dtype=torch.bool)
        drop[list(kept)] = False
        out[drop] = -math.inf
    return out, near


def request_seed(params: SamplingParams, xtc: XtcProcessor, slot: int) -> int:
    """The 32-bit seed XTC uses: the request's own, or the one the processor drew for it."""
    return _seed32(params.seed) if params.seed is not None else int(xtc.slots.host["seed"][slot])


def random_params(rng: random.Random) -> SamplingParams:
    extra: dict = {}
    if rng.random() < 0.5:
        extra["top_n_sigma"] = rng.choice([0.5, 1.0, 2.0, 3.0])
    if rng.random() < 0.5:
        extra["typical_p"] = rng.choice([0.2, 0.5, 0.9, 0.95, 1.0])
    if rng.random() < 0.5:
        extra["xtc_probability"] = rng.choice([0.0, 0.3, 1.0])
        if rng.random() < 0.7:
            extra["xtc_threshold"] = rng.choice([0.0, 0.02, 0.1, 0.3, 0.5])
    seed = rng.choice([None, rng.randrange(2**40), -5])
    return SamplingParams(
        temperature=rng.choice([0.0, 0.7, 1.0]), seed=seed, extra_args=extra or None
    )


def make_processors(strategy: type) -> list:
    cfg = fake_vllm_config(CAPACITY, VOCAB)
    procs = [
        cls(cfg, torch.device("cpu"), False)
        for cls in (TopNSigmaProcessor, TypicalPProcessor, XtcProcessor)
    ]
    for proc in procs:
        proc.mask = strategy(proc)
    return procs


def random_logits(rows: int, rng: random.Random) -> torch.Tensor:
    """Logits shaped like a model's: a few strong tokens over noise, some rows masked (as a
    grammar would leave them)."""
    logits = torch.randn(rows, VOCAB) * rng.choice([0.5, 2.0, 4.0])
    for r in range(rows):
        for _ in range(rng.randint(0, 4)):
            logits[r, rng.randrange(VOCAB)] += rng.uniform(2, 10)
        if rng.random() < 0.3:
            logits[r, torch.rand(VOCAB) < 0.6] = -math.inf
    return logits


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_v1_random_batches_match_reference(seed: int, strategy: type) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    procs = make_processors(strategy)
    xtc = procs[2]
    batch = V1Batch(CAPACITY, rng)
    next_id, checked, masked = 0, 0, 0
    for step in range(1000):
        new = []
        for _ in range(rng.randint(0, 3)):
            req = Request(next_id, random_params(rng), [rng.randrange(VOCAB) for _ in range(5)])
            new.append(req)
            next_id += 1
        counter_before = next(iter([xtc._unseeded]))
        update = batch.step(new)
        for proc in procs:
            proc.update_state(update)
        # The reference needs the seed the processor gave each unseeded request.
        for slot, req in enumerate(batch.rows):
            if not hasattr(req, "unseeded") or any(
                a[0] == slot for a in (update.added if update else [])
            ):
                req.unseeded = int(xtc.slots.host["seed"][slot])
        del counter_before
        if not batch.rows:
            continue
        logits = random_logits(len(batch.rows), rng)
        actual = logits.clone()
        for proc in procs:
            actual = proc.apply(actual)
        for i, req in enumerate(batch.rows):
            seed = request_seed(req.params, xtc, i)
            position = len(req.prompt) + len(req.output)
            expected, near = reference(logits[i], req.params, seed, position)
            differ = actual[i].view(torch.int32) != expected.view(torch.int32)
            where = f"step {step} row {i} req {req.req_id} {req.params.extra_args}"
            assert not bool((differ & ~near).any()), where
            kept = actual[i] > -math.inf
            assert bool(kept.any()), f"{where}: nothing left to sample"
            assert torch.equal(actual[i][kept], logits[i][kept]), f"{where}: kept values changed"
            masked += int((~kept & (logits[i] > -math.inf)).sum())
            checked += 1
            req.output.append(rng.randrange(VOCAB))
    assert checked > 3000 and masked > 10_000


def test_typical_p_on_a_full_vocabulary_matches_the_sorting_reference() -> None:
    """Vocabulary-sized rows, every strategy (the tensor histogram search, the host search
    that sorts the crossing bucket, in C and in NumPy) against the float64 reference that
    sorts everything."""
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    torch.manual_seed(5)
    vocab = 151_936
    masses = [0.1, 0.5, 0.9, 0.95, 0.99, 0.3, 0.7, 0.999]
    cfg = fake_vllm_config(len(masses), vocab)
    logits = torch.randn(len(masses), vocab) * 2
    logits[:, :50] += torch.linspace(8, 2, 50)
    logits[3, ::3] = -math.inf
    added = [
        (i, SamplingParams(temperature=1.0, extra_args={"typical_p": p}), [1], [])
        for i, p in enumerate(masses)
    ]
    for strategy in STRATEGIES:
        proc = TypicalPProcessor(cfg, torch.device("cpu"), False)
        proc.mask = strategy(proc)
        proc.update_state(BatchUpdate(batch_size=len(masses), removed=[], added=added, moved=[]))
        result = proc.apply(logits.clone())
        for i, p in enumerate(masses):
            kept, margin = typical_reference(logits[i].double().tolist(), p)
            got = set((result[i] > -math.inf).nonzero().flatten().tolist())
            differ = kept ^ got
            assert all(abs(margin[t]) < NEAR for t in differ), (strategy, p, len(differ))
            assert len(kept) > 10 or differ == set(), (strategy, p)


def test_typical_bounds_keep_the_most_typical_token_even_alone() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    low, high = typical_bounds(logits, torch.tensor([0.01, 0.3]))
    kept = (logits >= low.unsqueeze(1)) & (logits <= high.unsqueeze(1))
    assert kept[0].tolist() == [True, False, False, False]
    assert kept[1].all()  # four ties: all kept together


def test_xtc_draw_is_reproducible_and_has_the_requested_rate() -> None:
    seeds = torch.full((20_000,), _seed32(1234))
    positions = torch.arange(20_000)
    draws = uniform_hash(seeds, positions)
    assert torch.equal(draws, uniform_hash(seeds, positions))
    assert abs(float((draws < 0.3).double().mean()) - 0.3) < 0.02
    other = uniform_hash(torch.full((20_000,), _seed32(1235)), positions)
    assert not torch.equal(draws, other)


def test_greedy_rows_are_untouched() -> None:
    procs = make_processors(HostRowsMask)
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    extra = {"top_n_sigma": 0.1, "typical_p": 0.1, "xtc_probability": 1.0}
    added = [(0, SamplingParams(temperature=0.0, extra_args=extra), [1], [])]
    logits = torch.randn(1, VOCAB)
    for proc in procs:
        proc.update_state(BatchUpdate(batch_size=1, removed=[], added=added, moved=[]))
        assert torch.equal(proc.apply(logits.clone()), logits)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"top_n_sigma": 0}, "top_n_sigma"),
        ({"top_n_sigma": -1.0}, "top_n_sigma"),
        ({"top_n_sigma": "1"}, "top_n_sigma"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"xtc_probability": 1.2}, "xtc_probability"),
        ({"xtc_probability": 0.5, "xtc_threshold": 0.6}, "xtc_threshold"),
        ({"xtc_threshold": 0.1}, "xtc_threshold"),
        ({"xtc_probability": float("nan")}, "xtc_probability"),
    ],
)
def test_bad_values_are_refused_naming_the_field(extra: dict, field: str) -> None:
    with pytest.raises(OptionError) as err:
        Options.from_extra_args(extra)
    assert err.value.field == field
    assert f"'{field}'" in str(err.value)


@functools.cache
def typical_kernel_rows() -> dict:
    """``tests/v2_real/typical_kernel_rows.py``'s results (one interpreter process, ~25 s)."""
    return run_cases("typical_kernel_rows", "TYPICALROWS")


def test_typical_p_kernel_matches_the_sorting_reference() -> None:
    """The Triton kernel that V2 (and V1 on CUDA) uses, run in Triton's interpreter in a fresh
    process, keeps the float64 sorting reference's tokens on vocabulary-sized rows."""
    bounds = typical_kernel_rows()
    logits = typical_rows()
    for i, p in enumerate(TYPICAL_MASSES):
        row = logits[i]
        got = (row >= bounds["low"][i]) & (row <= bounds["high"][i]) & (row > -math.inf)
        got_ids = set(got.nonzero().flatten().tolist())
        if p >= 1.0:
            assert got_ids == set((row > -math.inf).nonzero().flatten().tolist())
            continue
        kept, margin = typical_reference(row.double().tolist(), p)
        if i == 5:  # all ties
            kept = set(range(row.numel()))
        differ = kept ^ got_ids
        assert all(abs(margin[t]) < NEAR for t in differ), (p, len(differ))
        assert got_ids, p


def test_typical_p_kernel_has_the_six_level_searchs_bounds_bit_for_bit() -> None:
    """The kernel's path histogram (4 passes of 64 buckets, #57) gives the bounds of the
    six-level search it replaced (a pass a level: ``tests/v2_real/typical_levels_reference.py``),
    bit for bit, on the rows above and on ties, peaked, flat, masked and multi-chunk rows:
    the same tokens kept, in two fewer passes over the logits."""
    result = typical_kernel_rows()
    assert result["compared"] >= 30
    assert result["differ"] == []


TYPICAL_MASSES = [0.1, 0.5, 0.9, 0.95, 0.99, 0.3, 0.7, 0.999, 1.0, 0.2]


def typical_rows() -> torch.Tensor:
    """The rows both processes build: a spread of shapes, one with masked tokens, one flat,
    one fully masked but for a single token."""
    torch.manual_seed(5)
    logits = torch.randn(len(TYPICAL_MASSES), 151_936) * 2
    logits[:, :50] += torch.linspace(8, 2, 50)
    logits[3, ::3] = -math.inf
    logits[5] = 0.25  # all ties: kept together
    logits[9] = -math.inf
    logits[9, 7] = 1.0
    return logits


def test_the_host_kernels_compile_here() -> None:
    """CI's machine, like vLLM's CPU deployments, has a C compiler: the C paths are the ones
    V1 on CPU runs, so the tests above must run them (not fall back unseen)."""
    assert host_kernel() is not None
    proc = TypicalPProcessor(fake_vllm_config(4, VOCAB), torch.device("cpu"), False)
    assert isinstance(proc.mask, HostRowsMask) and proc.host_kernel is not None


def test_without_a_compiler_or_switched_off_the_host_kernels_are_not_used(monkeypatch) -> None:
    from constrained.processors import host_kernels
    from constrained.settings import reset

    host_kernels.load.cache_clear()
    monkeypatch.setattr(host_kernels, "compiler", lambda: None)
    assert host_kernel() is None
    host_kernels.load.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("CONSTRAINED_HOST_KERNELS", "0")
    reset()
    try:
        assert host_kernel() is None
        proc = TypicalPProcessor(fake_vllm_config(4, VOCAB), torch.device("cpu"), False)
        assert proc.host_kernel is None  # and it runs the NumPy search (the tests above)
    finally:
        monkeypatch.delenv("CONSTRAINED_HOST_KERNELS")
        reset()
        host_kernels.load.cache_clear()


def test_the_host_kernels_agree_with_the_numpy_search_and_mask() -> None:
    """The C search keeps the tokens the NumPy search keeps, but for ties with the boundary
    (a sum's last bits: within ``NEAR`` of it); the C mask equals ``threshold_``'s, bit for
    bit, on every row shape the engine sends (peaked, flat, masked, one token, ties)."""
    kernel = host_kernel()
    torch.manual_seed(3)
    width = 151_936
    logits = torch.randn(12, width) * torch.tensor([0.3, 1, 2, 4, 8, 1, 2, 3, 1, 1, 2, 6])[:, None]
    logits[:, :20] += torch.linspace(15, 1, 20)
    logits[2, ::2] = -math.inf
    logits[5] = 0.5  # all ties
    logits[6] = -math.inf
    logits[6, 11] = 3.0  # one token
    logits[7, : width // 2] = -math.inf
    mass = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.99, 0.3, 0.7, 0.999, 0.2, 0.6, 0.8, 0.9])
    low_c, high_c = typical_bounds_native(logits, mass, Scratch(), kernel)
    blocks = [typical_bounds_on_host(logits[r : r + 4], mass[r : r + 4], Scratch())
              for r in range(0, 12, 4)]  # fmt: skip
    low_n, high_n = torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])
    for r in range(12):
        row = logits[r]
        ours = (row >= low_c[r]) & (row <= high_c[r]) & (row > -math.inf)
        theirs = (row >= low_n[r]) & (row <= high_n[r]) & (row > -math.inf)
        assert ours.any(), r
        differ = (ours ^ theirs).nonzero().flatten()
        edge = torch.minimum((row[differ] - low_n[r]).abs(), (row[differ] - high_n[r]).abs())
        assert bool((edge < NEAR * (1 + row[differ].abs())).all()), (r, differ.numel())
    rows = [0, 2, 3, 5, 6, 7, 9, 11]
    low, high = low_c[rows], high_c[rows]
    low[1], high[2] = -math.inf, math.inf  # a side left open
    expected = mask_outside_rows(logits.clone(), rows, low.tolist(), high.tolist())
    actual = mask_outside_rows_native(logits.clone(), rows, low, high, kernel)
    assert torch.equal(expected.view(torch.int32), actual.view(torch.int32))
    # The search and the mask fused (each row masked right after its search) mask as the
    # search's bounds and threshold_ do.
    fused = logits.clone()
    typical_bounds_native(fused, mass, Scratch(), kernel, mask=True)
    apart = mask_outside_rows(logits.clone(), list(range(12)), low_c.tolist(), high_c.tolist())
    assert torch.equal(fused.view(torch.int32), apart.view(torch.int32))
    # Rows split over threads (each with its own work rows) come out bit for bit the same,
    # bounds and mask, however many threads share them (more threads than rows included).
    for threads in (2, 3, 16):
        shared = logits.clone()
        low_t, high_t = typical_bounds_native(shared, mass, Scratch(), kernel, True, threads)
        assert torch.equal(shared.view(torch.int32), fused.view(torch.int32)), threads
        assert torch.equal(low_t, low_c) and torch.equal(high_t, high_c), threads


def test_the_host_kernels_share_rows_among_torchs_own_openmp_threads(monkeypatch) -> None:
    """Built with OpenMP, the kernels run on the runtime torch loaded (no second pool of
    threads to contend with torch's, which vLLM binds to its worker's cores): as many
    threads as torch's team, at most ``CONSTRAINED_HOST_THREADS``."""
    from constrained.processors import host_kernels
    from constrained.settings import reset

    kernel = host_kernel()
    assert not kernel.own_openmp
    assert host_kernels.threads(kernel) == torch.get_num_threads()
    monkeypatch.setenv("CONSTRAINED_HOST_THREADS", "1")
    reset()
    try:
        assert host_kernels.threads(kernel) == 1
        proc = TypicalPProcessor(fake_vllm_config(4, VOCAB), torch.device("cpu"), False)
        assert proc.host_threads == 1
    finally:
        monkeypatch.delenv("CONSTRAINED_HOST_THREADS")
        reset()


def test_xtc_kernel_matches_the_torch_path_bit_for_bit() -> None:
    """XTC's Triton kernel (V2), run in Triton's interpreter in a fresh process
    (``tests/v2_real/xtc_kernel_cases.py``): the same draws as ``uniform_hash`` on 1,500
    seeds and positions, and exactly the torch path's logits on 220 generated calls (off and
    greedy slots, draws in and out, ties at the top and at the least qualifying logit, masked
    and all-masked rows, rows wider than a chunk)."""
    result = run_cases("xtc_kernel_cases", "XTCKERNEL")
    assert result["draw_mismatches"] == 0
    assert result["mismatches"] == []
    covered = result["covered"]
    minimums = {
        "draws_applied": 300, "rows_off": 100, "rows_drawn_out": 100, "rows_drawn_in": 100,
        "lifted_rows_truncated": 30, "tie_top_rows_truncated": 8, "tie_least_rows_truncated": 15,
        "masked_rows_truncated": 15, "all_masked_rows_applied_untouched": 30,
        "wide_rows_truncated": 3,
    }  # fmt: skip
    short = {k: covered.get(k, 0) for k, want in minimums.items() if covered.get(k, 0) < want}
    assert not short, short
