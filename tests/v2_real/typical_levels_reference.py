"""Typical-p's six-level search, as ``truncation_kernels.typical_bounds_kernel`` ran it until
#57: the reference its path histogram must match bit for bit (``typical_kernel_rows.py``).

One launch a level (``3 + LEVELS`` = 9, 8 of them reading the logits): pass 0, each chunk's
top and bottom logit; pass 1, each chunk's Z and first moment; passes 2 .. 1 + LEVELS, each
chunk's 16-bucket histogram of ``d = |l - c|`` over the range the levels before narrowed
down to, and its mass below that range; the last, the bounds. Kept verbatim (kernel code
from ``constrained/processors/truncation_kernels.py`` at 1782b9a): do not improve it.
"""

from __future__ import annotations

import os

import torch
from vllm.triton_utils import tl, triton

from constrained.processors.truncation_math import FLOAT32_UNDERFLOW, TYPICAL_MARGIN

BINS = 16
LEVELS = 6  # BINS ** LEVELS == 4096 ** 2, the torch path's resolution
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 8192 if _INTERPRETED else 1024
CHUNK = 32768 if _INTERPRETED else 8192  # logits per program and pass


def _block(vocab: int) -> int:
    """A block no wider than the row (a narrow vocabulary under the interpreter)."""
    return min(BLOCK, triton.next_power_of_2(vocab))


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
    LEVELS: tl.constexpr,
    SPLIT_P2: tl.constexpr,
):
    """What the passes before this one found for ``row``: top, c (shifted), the current
    range ``[lo, lo + width)`` of ``d`` and the target mass. ``DONE`` levels are replayed."""
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
    lo = centre * 0.0
    bins = tl.arange(0, BINS)
    for level in tl.static_range(DONE):
        step = width / BINS
        cells = hist_ptr + ((row * LEVELS + level) * nsplit + s[:, None]) * BINS + bins[None, :]
        hist = tl.sum(tl.load(cells, mask=ok[:, None], other=0.0), 0)
        below = tl.sum(
            tl.load(below_ptr + (row * LEVELS + level) * nsplit + s, mask=ok, other=0.0), 0
        )
        running = below + tl.cumsum(hist, 0)
        crossing = tl.minimum(tl.sum((running <= target).to(tl.int32), 0), BINS - 1)
        lo = lo + crossing.to(tl.float32) * step
        width = step
    return top, centre, lo, width, target


@triton.jit
def _levels_pass_kernel(
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
    LEVELS: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK: tl.constexpr,
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
    elif PASS < 2 + LEVELS:  # the chunk's histogram at level PASS - 2
        top, centre, lo, width, _t = _replay(
            row, mass_ptr, stats_ptr, totals_ptr, hist_ptr, below_ptr, nsplit, PASS - 2,
            UNDERFLOW, BINS, LEVELS, SPLIT_P2,
        )  # fmt: skip
        step = width / BINS
        bins = tl.arange(0, BINS)
        hist = tl.zeros([BINS], tl.float64)
        below_acc = tl.zeros([BLOCK], tl.float64)
        for start in range(first, tl.minimum(first + CHUNK, vocab), BLOCK):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            shifted = x - top
            weight = tl.exp(shifted)
            distance = tl.abs(tl.maximum(shifted, -UNDERFLOW) - centre)
            scaled = (distance - lo) / step
            weight = weight.to(tl.float64)
            below_acc += tl.where(scaled < 0, weight, 0.0)
            bucket = tl.minimum(scaled, BINS - 1).to(tl.int32)  # floor: scaled >= 0 here
            hit = (bucket[:, None] == bins[None, :]) & (scaled >= 0)[:, None]
            hist += tl.sum(tl.where(hit, weight[:, None], 0.0), 0)
        cell = ((row * LEVELS + PASS - 2) * nsplit + part) * BINS
        tl.store(hist_ptr + cell + bins, hist)
        below = tl.sum(below_acc, 0)
        tl.store(below_ptr + (row * LEVELS + PASS - 2) * nsplit + part, below)
    else:  # one program per row: the bounds; the last crossing bucket is kept whole
        top, centre, lo, width, _t = _replay(
            row, mass_ptr, stats_ptr, totals_ptr, hist_ptr, below_ptr, nsplit, LEVELS,
            UNDERFLOW, BINS, LEVELS, SPLIT_P2,
        )  # fmt: skip
        middle = (top + centre).to(tl.float64)
        radius = (lo + width).to(tl.float64)
        radius = radius + MARGIN * (tl.abs(middle) + radius + 1.0)
        keep_all = (tl.load(mass_ptr + row) >= 1.0) | (top == float("-inf"))
        tl.store(low_ptr + row, tl.where(keep_all, float("-inf"), middle - radius).to(tl.float32))
        tl.store(high_ptr + row, tl.where(keep_all, float("inf"), middle + radius).to(tl.float32))


def typical_levels_bounds(
    logits: torch.Tensor, mass: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The six-level search: ``(low, high)`` float32, in ``3 + LEVELS`` launches.

    Args:
        logits: [rows, vocab] float32 on a Triton device (rows contiguous in the last dim).
        mass: [rows] float32 ``typical_p``; ``>= 1`` keeps the row whole.
    """
    rows, vocab = logits.shape
    device = logits.device
    low = torch.empty(rows, dtype=torch.float32, device=device)
    high = torch.empty_like(low)
    if rows == 0:
        return low, high
    assert logits.stride(1) == 1, "typical_levels_bounds: rows must be contiguous"
    nsplit = triton.cdiv(vocab, CHUNK)
    stats = torch.empty(rows, nsplit, 4, dtype=torch.float32, device=device)
    totals = torch.empty(rows, nsplit, dtype=torch.float64, device=device)
    hist = torch.empty(rows, LEVELS, nsplit, BINS, dtype=torch.float64, device=device)
    below = torch.empty(rows, LEVELS, nsplit, dtype=torch.float64, device=device)
    mass = mass.to(torch.float32)
    fixed = {"MARGIN": TYPICAL_MARGIN, "UNDERFLOW": FLOAT32_UNDERFLOW, "BINS": BINS,
             "LEVELS": LEVELS, "SPLIT_P2": triton.next_power_of_2(nsplit), "BLOCK": _block(vocab),
             "CHUNK": CHUNK, "num_warps": 8}  # fmt: skip
    args = (logits, logits.stride(0), vocab, mass, stats, totals, hist, below, low, high)
    for p in range(2 + LEVELS):
        _levels_pass_kernel[(rows, nsplit)](*args, PASS=p, **fixed)
    _levels_pass_kernel[(rows, 1)](*args, PASS=2 + LEVELS, **fixed)
    return low, high
