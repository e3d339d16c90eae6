"""The truncation samplers' Triton kernels (Model Runner V2, and V1 on CUDA).

- ``typical_bounds_kernel``: typical-p's bounds, the same search as
  ``truncation_math.typical_bounds`` (read its docstring for the math) in ``3 + PASSES`` = 7
  launches, 6 of them reading the logits, and nothing ``[rows, vocab]``-sized. Each launch
  runs ``rows x splits`` programs, one per chunk of a row (``CHUNK`` logits), so a small batch
  still fills the GPU:

  1. pass 0: each chunk's top and bottom logit;
  2. pass 1: each chunk's ``sum(exp(l - top))`` and ``sum(exp(l - top) * (l - top))``;
  3. passes 2 .. 1 + PASSES: each chunk's ``BINS``-bucket histogram of the next 6 bits of
     the tokens' paths (below), weighted by ``exp(l - top)``, over the tokens whose path
     starts as the crossing one's, and the mass of the tokens whose path is below it;
  4. the last pass, one program per row: the bounds.

  The search is ``LEVELS`` = 6 levels of ``DIGIT_BINS`` = 16 buckets over ``d = |l - c|``
  (the torch path's 4096 x 2 = ``2**-24`` of the range of ``d``), each level over the bucket
  of the level before where the running mass crosses ``typical_p``; until #57 each level was
  a pass of its own (9 launches, 8 reading the logits). A token's *path* is the bucket its
  own ``d`` falls in at each level, every level within the token's own bucket of the level
  before, in the search's float32 arithmetic op for op: 24 bits. Paths are ordered as ``d``
  is, so the path bucket where the running mass crosses is the crossing token's path, which
  is the level search's buckets. Each histogram pass finds 6 more bits of it (4 passes x 64
  buckets = 6 levels x 16), so the bounds are the level search's, bit for bit, but for a
  float64 sum of masses within rounding of the target, as each sums in its own order
  (``tests/v2_real/typical_kernel_rows.py`` checks them against that search, kept as
  ``tests/v2_real/typical_levels_reference.py``).

  The masses (Z, each bucket, the mass below a range) are summed in float64: at
  ``typical_p`` near 1 the boundary lies in the far tail, where a token weighs ~1e-10 of Z,
  far below float32's rounding of a sum of Z. Every program first replays what the passes
  before it found, from their per-chunk results, in a fixed order: no atomics and no host
  reads, so a row's bounds are the same on every rank and every run. A pass counts 64 buckets
  a token where a level counted 16; from the third pass on, a block with no token inside the
  crossing path's range skips them. On an H200 each histogram pass takes about as long
  whether it counts or skips (~2 ms at 248,320 x 256; ``benchmarks/gpu_typical.py``): the
  paths' arithmetic and 168 registers a thread (one block per SM), not the counting.

- ``top_n_sigma_bounds_kernel``: top-n-sigma's bound in three launches of the same shape
  (the torch form is ~16 ops with ``[rows, vocab]`` temporaries).

- ``mask_outside_kernel``: ``truncation_math.mask_outside`` in one pass that stores only the
  entries it masks (the torch form is two compares and two ``masked_fill_``).

- ``xtc_kernel`` (Model Runner V2): XTC's draw, bound and mask in four launches of the same
  shape, reading the per-slot columns by slot (the torch path was 41 launches: gathers, the
  hash's ~25 integer ops, ``logsumexp`` and the mask).

The torch path for typical-p was 7-15 ms per step on an H200 at batch 256 (a ``scatter_add``
histogram with hot buckets, ``int64 [rows, vocab]`` temporaries); see docs/benchmarks.md#gpu.
"""

from __future__ import annotations

import os

import torch
from vllm.triton_utils import tl, triton

from constrained.processors.truncation_math import FLOAT32_UNDERFLOW, TYPICAL_MARGIN

DIGIT_BINS = 16  # the search: 16 buckets a level ...
LEVELS = 6  # ... 6 levels deep: 16 ** 6 == 4096 ** 2, the torch path's resolution
BINS = 64  # buckets a histogram pass: 6 bits of a token's 24-bit path
PASSES = 4  # histogram passes: 4 x 6 bits = 6 levels x 4 bits
assert BINS**PASSES == DIGIT_BINS**LEVELS
# Triton's interpreter (the CPU V2 tests) runs each block op in numpy: wide blocks, few ops.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 8192 if _INTERPRETED else 1024
HIST_BLOCK = 16384 if _INTERPRETED else 256  # a histogram pass's [BINS, block] one-hot
CHUNK = 32768 if _INTERPRETED else 8192  # logits per program and pass
MASK_BLOCK = 8192 if _INTERPRETED else 2048


def _block(vocab: int, widest: int = BLOCK) -> int:
    """A block no wider than the row (a narrow vocabulary under the interpreter)."""
    return min(widest, triton.next_power_of_2(vocab))


@triton.jit
def _replay_top(row, stats_ptr, nsplit, SPLIT_P2: tl.constexpr):
    """The row's top logit, from pass 0's per-chunk results."""
    s = tl.arange(0, SPLIT_P2)
    return tl.max(
        tl.load(stats_ptr + (row * nsplit + s) * 4, mask=s < nsplit, other=float("-inf")), 0
    )


@triton.jit
def _replay(
    row,
    mass_ptr,
    stats_ptr,
    totals_ptr,
    hist_ptr,
    below_ptr,
    nsplit,
    DONE: tl.constexpr,
    UNDERFLOW: tl.constexpr,
    BINS: tl.constexpr,
    PASSES: tl.constexpr,
    SPLIT_P2: tl.constexpr,
):
    """What the passes before this one found for ``row``: top, c (shifted), the range of
    ``d``, the target mass and the crossing path's first ``DONE`` digits of ``BINS`` buckets
    (an integer; ``DONE`` histogram passes are replayed)."""
    s = tl.arange(0, SPLIT_P2)
    ok = s < nsplit
    stats = stats_ptr + (row * nsplit + s) * 4
    top = tl.max(tl.load(stats, mask=ok, other=float("-inf")), 0)
    bottom = tl.min(tl.load(stats + 1, mask=ok, other=float("inf")), 0)
    bottom = tl.maximum(bottom - top, -UNDERFLOW)
    total = tl.sum(tl.load(stats + 2, mask=ok, other=0.0), 0)
    centre = tl.sum(tl.load(stats + 3, mask=ok, other=0.0), 0) / total
    width = tl.maximum(tl.maximum(-centre, centre - bottom), 1e-3)
    total64 = tl.sum(tl.load(totals_ptr + row * nsplit + s, mask=ok, other=0.0), 0)
    target = tl.load(mass_ptr + row).to(tl.float64) * total64
    path = 0
    bins = tl.arange(0, BINS)
    for done in tl.static_range(DONE):
        cells = hist_ptr + ((row * PASSES + done) * nsplit + s[:, None]) * BINS + bins[None, :]
        hist = tl.sum(tl.load(cells, mask=ok[:, None], other=0.0), 0)
        below = tl.sum(
            tl.load(below_ptr + (row * PASSES + done) * nsplit + s, mask=ok, other=0.0), 0
        )
        running = below + tl.cumsum(hist, 0)
        crossing = tl.minimum(tl.sum((running <= target).to(tl.int32), 0), BINS - 1)
        path = path * BINS + crossing
    return top, centre, width, target, path


@triton.jit
def _token_paths(distance, width, DEPTH: tl.constexpr, DIGIT_BINS: tl.constexpr):
    """Each token's path: its bucket at each of the search's first ``DEPTH`` levels, each
    level within the token's own bucket of the level before (an integer of ``DEPTH`` digits
    of ``DIGIT_BINS``). The float32 arithmetic is the search's, op for op (below its range:
    bucket 0; above it: the last), so the crossing token's path is the search's buckets."""
    lo = distance * 0.0
    path = tl.zeros(distance.shape, tl.int32)
    for _level in tl.static_range(DEPTH):
        step = width / DIGIT_BINS
        scaled = (distance - lo) / step
        digit = tl.minimum(tl.maximum(scaled, 0.0), DIGIT_BINS - 1).to(tl.int32)
        path = path * DIGIT_BINS + digit
        lo = lo + digit.to(tl.float32) * step
        width = step
    return path


@triton.jit
def _typical_pass_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    mass_ptr,
    stats_ptr,
    totals_ptr,
    hist_ptr,
    below_ptr,
    low_ptr,
    high_ptr,
    PASS: tl.constexpr,
    MARGIN: tl.constexpr,
    UNDERFLOW: tl.constexpr,
    BINS: tl.constexpr,
    BITS: tl.constexpr,
    PASSES: tl.constexpr,
    DIGIT_BINS: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
    LEVELS: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    HIST_BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    nsplit = tl.cdiv(vocab, CHUNK)
    base = logits_ptr + row * logits_stride
    offs = tl.arange(0, BLOCK)
    first = part * CHUNK  # a chunk's loop stops at the row's end: no block wholly masked
    if PASS == 0:  # the chunk's top and bottom logit
        top_acc = tl.full([BLOCK], float("-inf"), tl.float32)
        bottom_acc = tl.full([BLOCK], float("inf"), tl.float32)
        for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
            idx = start + offs
            ok = idx < vocab
            x = tl.load(base + idx, mask=ok, other=float("-inf"))
            top_acc = tl.maximum(top_acc, x)
            bottom_acc = tl.minimum(bottom_acc, tl.where(ok, x, float("inf")))
        stats = stats_ptr + (row * nsplit + part) * 4
        tl.store(stats, tl.max(top_acc, 0))
        tl.store(stats + 1, tl.min(bottom_acc, 0))
    elif PASS == 1:  # the chunk's Z and first moment (shifted by the row's top)
        top = _replay_top(row, stats_ptr, nsplit, SPLIT_P2)
        total_acc = tl.zeros([BLOCK], tl.float64)  # float64: see the note on precision
        moment_acc = tl.zeros([BLOCK], tl.float32)
        for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            shifted = x - top
            weight = tl.exp(shifted)  # masked tokens weigh 0
            total_acc += weight.to(tl.float64)
            moment_acc += weight * tl.maximum(shifted, -UNDERFLOW)
        stats = stats_ptr + (row * nsplit + part) * 4
        tl.store(stats + 2, tl.sum(total_acc, 0).to(tl.float32))
        tl.store(totals_ptr + row * nsplit + part, tl.sum(total_acc, 0))
        tl.store(stats + 3, tl.sum(moment_acc, 0))
    elif PASS < 2 + PASSES:  # the chunk's histogram of the path's next digit of BINS
        top, centre, width, _target, known = _replay(
            row, mass_ptr, stats_ptr, totals_ptr, hist_ptr, below_ptr, nsplit, PASS - 2,
            UNDERFLOW, BINS, PASSES, SPLIT_P2,
        )  # fmt: skip
        # the bits this pass and the ones before find span ``depth`` levels (and ``spare``
        # bits of a level that the next pass finds)
        depth: tl.constexpr = (BITS * (PASS - 1) + DIGIT_BITS - 1) // DIGIT_BITS
        spare: tl.constexpr = DIGIT_BITS * depth - BITS * (PASS - 1)
        hoffs = tl.arange(0, HIST_BLOCK)
        bins = tl.arange(0, BINS)
        hist = tl.zeros([BINS, HIST_BLOCK], tl.float64)  # summed once, at the chunk's end
        below_acc = tl.zeros([HIST_BLOCK], tl.float64)
        for start in range(first, tl.minimum(first + CHUNK, vocab), HIST_BLOCK):
            idx = start + hoffs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            shifted = x - top
            weight = tl.exp(shifted).to(tl.float64)
            distance = tl.abs(tl.maximum(shifted, -UNDERFLOW) - centre)
            path = _token_paths(distance, width, depth, DIGIT_BINS) >> spare
            prefix = path >> BITS  # to compare with what the passes before found
            below_acc += tl.where(prefix < known, weight, 0.0)
            digit = tl.where(prefix == known, path & (BINS - 1), BINS)  # BINS: outside
            if tl.min(digit, 0) < BINS:  # after two passes, few blocks hold a token inside
                hist = tl.where(bins[:, None] == digit[None, :], hist + weight[None, :], hist)
        cell = ((row * PASSES + PASS - 2) * nsplit + part) * BINS
        tl.store(hist_ptr + cell + bins, tl.sum(hist, 1))
        below = tl.sum(below_acc, 0)
        tl.store(below_ptr + (row * PASSES + PASS - 2) * nsplit + part, below)
    else:  # one program per row: the bounds; the last crossing bucket is kept whole
        top, centre, width, _t, path = _replay(
            row, mass_ptr, stats_ptr, totals_ptr, hist_ptr, below_ptr, nsplit, PASSES,
            UNDERFLOW, BINS, PASSES, SPLIT_P2,
        )  # fmt: skip
        lo = centre * 0.0
        for level in tl.static_range(LEVELS):  # the crossing path's buckets, level by level
            step = width / DIGIT_BINS
            digit = (path >> (DIGIT_BITS * (LEVELS - 1 - level))) & (DIGIT_BINS - 1)
            lo = lo + digit.to(tl.float32) * step
            width = step
        middle = (top + centre).to(tl.float64)
        radius = (lo + width).to(tl.float64)
        radius = radius + MARGIN * (tl.abs(middle) + radius + 1.0)
        keep_all = (tl.load(mass_ptr + row) >= 1.0) | (top == float("-inf"))
        tl.store(low_ptr + row, tl.where(keep_all, float("-inf"), middle - radius).to(tl.float32))
        tl.store(high_ptr + row, tl.where(keep_all, float("inf"), middle + radius).to(tl.float32))


def typical_bounds_kernel(
    logits: torch.Tensor, mass: torch.Tensor, tuning: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``truncation_math.typical_bounds`` in ``3 + PASSES`` = 7 launches, 6 reading the
    logits: ``(low, high)`` float32 (the module's docstring has the passes).

    Args:
        logits: [rows, vocab] float32 on a Triton device (rows contiguous in the last dim).
        mass: [rows] float32 ``typical_p``; ``>= 1`` keeps the row whole.
        tuning: launch settings over the defaults (``CHUNK``, ``BLOCK``, ``HIST_BLOCK``,
            ``num_warps``), for ``benchmarks/gpu_typical.py``'s sweep.
    """
    tuning = tuning or {}
    chunk = tuning.get("CHUNK", CHUNK)
    rows, vocab = logits.shape
    device = logits.device
    low = torch.empty(rows, dtype=torch.float32, device=device)
    high = torch.empty_like(low)
    if rows == 0:
        return low, high
    assert logits.stride(1) == 1, "typical_bounds_kernel: rows must be contiguous"
    nsplit = triton.cdiv(vocab, chunk)
    stats = torch.empty(rows, nsplit, 4, dtype=torch.float32, device=device)
    totals = torch.empty(rows, nsplit, dtype=torch.float64, device=device)
    hist = torch.empty(rows, PASSES, nsplit, BINS, dtype=torch.float64, device=device)
    below = torch.empty(rows, PASSES, nsplit, dtype=torch.float64, device=device)
    mass = mass.to(torch.float32)
    fixed = {"MARGIN": TYPICAL_MARGIN, "UNDERFLOW": FLOAT32_UNDERFLOW, "BINS": BINS,
             "BITS": BINS.bit_length() - 1, "PASSES": PASSES, "DIGIT_BINS": DIGIT_BINS,
             "DIGIT_BITS": DIGIT_BINS.bit_length() - 1, "LEVELS": LEVELS,
             "SPLIT_P2": triton.next_power_of_2(nsplit), "BLOCK": _block(vocab),
             "HIST_BLOCK": _block(vocab, HIST_BLOCK), "CHUNK": CHUNK, "num_warps": 8}  # fmt: skip
    fixed |= tuning
    args = (logits, logits.stride(0), vocab, mass, stats, totals, hist, below, low, high)
    for p in range(2 + PASSES):
        _typical_pass_kernel[(rows, nsplit)](*args, PASS=p, **fixed)
    _typical_pass_kernel[(rows, 1)](*args, PASS=2 + PASSES, **fixed)
    return low, high


@triton.jit
def _top_n_sigma_pass_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    n_ptr,
    stats_ptr,
    low_ptr,
    PASS: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    nsplit = tl.cdiv(vocab, CHUNK)
    base = logits_ptr + row * logits_stride
    offs = tl.arange(0, BLOCK)
    first = part * CHUNK
    s = tl.arange(0, SPLIT_P2)
    stats = stats_ptr + (row * nsplit + s) * 4
    if PASS == 0:  # the chunk's top, finite count and finite sum
        top_acc = tl.full([BLOCK], float("-inf"), tl.float32)
        count_acc = tl.zeros([BLOCK], tl.float32)
        sum_acc = tl.zeros([BLOCK], tl.float32)
        for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            finite = x > float("-inf")
            top_acc = tl.maximum(top_acc, x)
            count_acc += finite.to(tl.float32)
            sum_acc += tl.where(finite, x, 0.0)
        mine = stats_ptr + (row * nsplit + part) * 4
        tl.store(mine, tl.max(top_acc, 0))
        tl.store(mine + 1, tl.sum(count_acc, 0))
        tl.store(mine + 2, tl.sum(sum_acc, 0))
    else:
        ok = s < nsplit
        count = tl.sum(tl.load(stats + 1, mask=ok, other=0.0), 0)
        mean = tl.sum(tl.load(stats + 2, mask=ok, other=0.0), 0) / count
        if PASS == 1:  # the chunk's sum of squared deviations of finite logits
            sq_acc = tl.zeros([BLOCK], tl.float32)
            for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
                idx = start + offs
                x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
                deviation = tl.where(x > float("-inf"), x - mean, 0.0)
                sq_acc += deviation * deviation
            tl.store(stats_ptr + (row * nsplit + part) * 4 + 3, tl.sum(sq_acc, 0))
        else:  # one program per row: low = top - n * std; nan (no spread to speak of) keeps all
            top = tl.max(tl.load(stats, mask=ok, other=float("-inf")), 0)
            std = tl.sqrt(tl.sum(tl.load(stats + 3, mask=ok, other=0.0), 0)) / tl.sqrt(count)
            low = top - tl.load(n_ptr + row) * std
            tl.store(low_ptr + row, tl.where(low == low, low, float("-inf")))


def top_n_sigma_bounds_kernel(logits: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, None]:
    """``truncation_math.top_n_sigma_bounds`` in three launches: ``(low, None)``.

    Pass 0: each chunk's top, finite count and sum; pass 1: each chunk's squared deviations
    from the row's mean (two passes, as the torch form, for a stable variance); then the
    bound per row. Every program replays the row's totals from the per-chunk results.
    """
    rows, vocab = logits.shape
    low = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return low, None
    assert logits.stride(1) == 1, "top_n_sigma_bounds_kernel: rows must be contiguous"
    nsplit = triton.cdiv(vocab, CHUNK)
    stats = torch.empty(rows, nsplit, 4, dtype=torch.float32, device=logits.device)
    fixed = {"SPLIT_P2": triton.next_power_of_2(nsplit), "BLOCK": _block(vocab), "CHUNK": CHUNK,
             "num_warps": 8}  # fmt: skip
    args = (logits, logits.stride(0), vocab, n.to(torch.float32), stats, low)
    _top_n_sigma_pass_kernel[(rows, nsplit)](*args, PASS=0, **fixed)
    _top_n_sigma_pass_kernel[(rows, nsplit)](*args, PASS=1, **fixed)
    _top_n_sigma_pass_kernel[(rows, 1)](*args, PASS=2, **fixed)
    return low, None


@triton.jit
def _mask_outside_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    low_ptr,
    high_ptr,
    HAS_LOW: tl.constexpr,
    HAS_HIGH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < vocab
    ptrs = logits_ptr + row * logits_stride + idx
    x = tl.load(ptrs, mask=ok, other=0.0)
    drop = tl.zeros([BLOCK], tl.int1)
    if HAS_LOW:
        drop = drop | (x < tl.load(low_ptr + row))
    if HAS_HIGH:
        drop = drop | (x > tl.load(high_ptr + row))
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), tl.float32), mask=ok & drop)


def mask_outside_kernel(
    logits: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None
) -> torch.Tensor:
    """``truncation_math.mask_outside`` in one launch (``None``: that side is open)."""
    rows, vocab = logits.shape
    if rows == 0 or (low is None and high is None):
        return logits
    assert logits.stride(1) == 1, "mask_outside_kernel: rows must be contiguous"
    grid = (rows, triton.cdiv(vocab, MASK_BLOCK))
    _mask_outside_kernel[grid](
        logits,
        logits.stride(0),
        vocab,
        logits if low is None else low.float(),  # an open side's pointer is never read
        logits if high is None else high.float(),
        HAS_LOW=low is not None,
        HAS_HIGH=high is not None,
        BLOCK=MASK_BLOCK,
    )
    return logits


@triton.jit
def _mix32(x):
    """``truncation_math._mix32``: a 32-bit integer hash, in int64 (products below 2**59)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _xtc_draw(row, row_slots_ptr, pos_ptr, probability_ptr, seed_ptr):
    """The row's slot, and whether XTC applies to it this step: ``truncation_math.
    uniform_hash(seed, pos + 1) < xtc_probability``, the same integer hash and float64 draw."""
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    seed = tl.load(seed_ptr + slot).to(tl.int64)
    position = tl.load(pos_ptr + row).to(tl.int64) + 1  # the token being sampled
    x = (_mix32(seed) ^ (position * 0x2545F491)) & 0xFFFFFFFF
    draw = _mix32(x).to(tl.float64) / 4294967296.0
    return slot, draw < tl.load(probability_ptr + slot).to(tl.float64)


@triton.jit
def _xtc_pass_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    row_slots_ptr,
    pos_ptr,
    probability_ptr,
    threshold_ptr,
    seed_ptr,
    stats_ptr,
    totals_ptr,
    PASS: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    slot, applies = _xtc_draw(row, row_slots_ptr, pos_ptr, probability_ptr, seed_ptr)
    if not applies:  # not this step (or not this request): the row is left alone
        return
    nsplit = tl.cdiv(vocab, CHUNK)
    base = logits_ptr + row * logits_stride
    offs = tl.arange(0, BLOCK)
    first = part * CHUNK
    s = tl.arange(0, SPLIT_P2)
    ok = s < nsplit
    stats = stats_ptr + (row * nsplit + s) * 2
    mine = stats_ptr + (row * nsplit + part) * 2
    if PASS == 0:  # the chunk's top
        top_acc = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
            idx = start + offs
            top_acc = tl.maximum(
                top_acc, tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            )
        tl.store(mine, tl.max(top_acc, 0))
    else:
        top = tl.max(tl.load(stats, mask=ok, other=float("-inf")), 0)
        shift = tl.where(tl.abs(top) == float("inf"), 0.0, top)  # as torch.logsumexp
        if PASS == 1:  # the chunk's sum of exp(l - shift), in float64
            total_acc = tl.zeros([BLOCK], tl.float64)
            for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
                idx = start + offs
                x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
                total_acc += tl.exp(x - shift).to(tl.float64)
            tl.store(totals_ptr + row * nsplit + part, tl.sum(total_acc, 0))
        else:
            total = tl.sum(tl.load(totals_ptr + row * nsplit + s, mask=ok, other=0.0), 0)
            lse = tl.log(total.to(tl.float32)) + shift
            cut = lse + tl.log(tl.load(threshold_ptr + slot))
            cut = tl.maximum(cut, -3.4028234663852886e38)  # float32's lowest: -inf never qualifies
            if PASS == 2:  # the chunk's least qualifying logit
                least_acc = tl.full([BLOCK], float("inf"), tl.float32)
                for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
                    idx = start + offs
                    x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
                    least_acc = tl.minimum(least_acc, tl.where(x >= cut, x, float("inf")))
                tl.store(mine + 1, tl.min(least_acc, 0))
            else:  # the mask: every logit above the least qualifying one
                least = tl.min(tl.load(stats + 1, mask=ok, other=float("inf")), 0)
                for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
                    idx = start + offs
                    inside = idx < vocab
                    x = tl.load(base + idx, mask=inside, other=float("-inf"))
                    drop = inside & (x > least)
                    tl.store(base + idx, tl.full([BLOCK], float("-inf"), tl.float32), mask=drop)


def xtc_kernel(
    logits: torch.Tensor,
    row_slots: torch.Tensor,
    pos: torch.Tensor,
    probability: torch.Tensor,
    threshold: torch.Tensor,
    seed: torch.Tensor,
) -> torch.Tensor:
    """XTC under Model Runner V2 in four launches, in place: the draw, ``truncation_math.
    xtc_bounds`` and the mask, reading the per-slot columns directly (no gathers).

    Each of ``rows x chunks`` programs first draws (``uniform_hash(seed, pos + 1) <
    xtc_probability``, the torch path's integer hash) and leaves a row that does not apply at
    once. Then pass 0: each chunk's top logit; pass 1: each chunk's ``sum(exp(l - top))`` in
    float64; pass 2: ``cut = log(Z) + top + log(threshold)`` replayed from the per-chunk
    results, and each chunk's least logit ``>= cut``; pass 3: every logit above the row's least
    qualifying one set to ``-inf``. No atomics, no host reads. The kept set is the torch
    path's except where a logit lies within rounding of the cut (torch's ``logsumexp`` sums
    in another order, as it does on CPU and GPU).

    Args:
        logits: [rows, vocab] float32 on a Triton device (rows contiguous in the last dim).
        row_slots: [rows] each row's slot; pos: [rows] its input position (V2's ``ctx.pos``).
        probability, threshold: [slots] float32 (probability 0: off); seed: [slots] int64.

    Example: ``p = [0.5, 0.3, 0.15, 0.05]``, threshold 0.1, a draw that applies: 0.5 and 0.3
    go to ``-inf``, 0.15 (the least likely at or above 0.1) and 0.05 stay.
    """
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    assert logits.stride(1) == 1, "xtc_kernel: rows must be contiguous"
    nsplit = triton.cdiv(vocab, CHUNK)
    stats = torch.empty(rows, nsplit, 2, dtype=torch.float32, device=logits.device)
    totals = torch.empty(rows, nsplit, dtype=torch.float64, device=logits.device)
    fixed = {"SPLIT_P2": triton.next_power_of_2(nsplit), "BLOCK": _block(vocab), "CHUNK": CHUNK,
             "num_warps": 8}  # fmt: skip
    args = (logits, logits.stride(0), vocab, row_slots, pos, probability, threshold, seed,
            stats, totals)  # fmt: skip
    for p in range(4):
        _xtc_pass_kernel[(rows, nsplit)](*args, PASS=p, **fixed)
    return logits
