"""Typical-p's bounds in one Triton launch per step (Model Runner V2, and V1 on CUDA).

The same search as ``truncation_math.typical_bounds`` (read its docstring for the math), done
by one program per row that streams its logits row ``2 + LEVELS`` times and keeps nothing
``[rows, vocab]``-sized:

1. the row's top and bottom logit;
2. ``Z = sum(exp(l - top))`` and the expected logit ``c`` (shifted by ``top``), hence the
   range of ``d = |l - c|`` and the target mass ``typical_p * Z`` (float64);
3. ``LEVELS`` rounds of a ``BINS``-bucket histogram of ``d`` weighted by ``exp(l - top)``,
   each refining the bucket where the running mass crosses the target (16 buckets x 6 levels
   = the torch path's 4096 x 2 = ``2**-24`` of the range of ``d``). Each round recounts the
   mass below its range itself, so a token at a bucket edge is counted once per round, never
   twice.

Then the kept interval ``[c - s, c + s]`` widened by ``TYPICAL_MARGIN``, as the torch path.
No atomics and a fixed summation order, so a row's bounds are the same on every rank and
every run. On the GPU the torch path was 7-15 ms per step at batch 256 (a ``scatter_add``
histogram with hot buckets, two ``int64 [rows, vocab]`` temporaries); this reads the logits
eight times and writes two floats per row.
"""

from __future__ import annotations

import os

import torch
from vllm.triton_utils import tl, triton

from constrained.processors.truncation_math import FLOAT32_UNDERFLOW, TYPICAL_MARGIN

BINS = 16
LEVELS = 6  # BINS ** LEVELS == 4096 ** 2, the torch path's resolution
# Triton's interpreter (the CPU V2 tests) runs each block op in numpy: wide blocks, few ops.
BLOCK = 8192 if os.environ.get("TRITON_INTERPRET") == "1" else 1024


@triton.jit
def _typical_bounds_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    mass_ptr,
    low_ptr,
    high_ptr,
    MARGIN: tl.constexpr,
    UNDERFLOW: tl.constexpr,
    BINS: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * logits_stride
    offs = tl.arange(0, BLOCK)
    mass = tl.load(mass_ptr + row).to(tl.float64)

    # 1. top and bottom (masked tokens are -inf; the bottom is clamped below, as the torch path)
    top_acc = tl.full([BLOCK], float("-inf"), tl.float32)
    bottom_acc = tl.full([BLOCK], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        ok = idx < vocab
        x = tl.load(base + idx, mask=ok, other=float("-inf"))
        top_acc = tl.maximum(top_acc, x)
        bottom_acc = tl.minimum(bottom_acc, tl.where(ok, x, float("inf")))
    top = tl.max(top_acc, 0)
    bottom = tl.maximum(tl.min(bottom_acc, 0) - top, -UNDERFLOW)

    # 2. Z and the expected logit c (shifted): sum(w * shifted) / sum(w), w = exp(l - top)
    total_acc = tl.zeros([BLOCK], tl.float32)
    moment_acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
        shifted = x - top
        weight = tl.exp(shifted)  # masked tokens weigh 0
        total_acc += weight
        moment_acc += weight * tl.maximum(shifted, -UNDERFLOW)
    total = tl.sum(total_acc, 0)
    centre = tl.sum(moment_acc, 0) / total
    width = tl.maximum(tl.maximum(-centre, centre - bottom), 1e-3)
    target = mass * total.to(tl.float64)

    # 3. the crossing bucket, refined LEVELS times
    lo = centre * 0.0  # a float32 scalar: the start of the crossing bucket's range
    bins = tl.arange(0, BINS)
    for _level in tl.static_range(LEVELS):
        step = width / BINS
        hist = tl.zeros([BINS], tl.float64)
        below_acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf"))
            shifted = x - top
            weight = tl.exp(shifted)
            distance = tl.abs(tl.maximum(shifted, -UNDERFLOW) - centre)
            scaled = (distance - lo) / step
            below_acc += tl.where(scaled < 0, weight, 0.0)
            bucket = tl.minimum(scaled, BINS - 1).to(tl.int32)  # floor: scaled >= 0 here
            hit = (bucket[:, None] == bins[None, :]) & (scaled >= 0)[:, None]
            hist += tl.sum(tl.where(hit, weight[:, None], 0.0), 0).to(tl.float64)
        running = tl.sum(below_acc, 0).to(tl.float64) + tl.cumsum(hist, 0)
        crossing = tl.minimum(tl.sum((running <= target).to(tl.int32), 0), BINS - 1)
        lo = lo + crossing.to(tl.float32) * step
        width = step

    # the last crossing bucket is kept whole; then the interval, widened by MARGIN
    middle = (top + centre).to(tl.float64)
    radius = (lo + width).to(tl.float64)
    radius = radius + MARGIN * (tl.abs(middle) + radius + 1.0)
    keep_all = (mass >= 1.0) | (top == float("-inf"))
    low = tl.where(keep_all, float("-inf"), middle - radius)
    high = tl.where(keep_all, float("inf"), middle + radius)
    tl.store(low_ptr + row, low.to(tl.float32))
    tl.store(high_ptr + row, high.to(tl.float32))


def typical_bounds_kernel(
    logits: torch.Tensor, mass: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``truncation_math.typical_bounds`` in one launch: ``(low, high)`` float32 per row.

    Args:
        logits: [rows, vocab] float32 on a Triton device (rows contiguous in the last dim).
        mass: [rows] float32 ``typical_p``; ``>= 1`` keeps the row whole.
    """
    rows, vocab = logits.shape
    low = torch.empty(rows, dtype=torch.float32, device=logits.device)
    high = torch.empty_like(low)
    if rows == 0:
        return low, high
    assert logits.stride(1) == 1, "typical_bounds_kernel: rows must be contiguous"
    _typical_bounds_kernel[(rows,)](
        logits,
        logits.stride(0),
        vocab,
        mass.to(torch.float32),
        low,
        high,
        MARGIN=TYPICAL_MARGIN,
        UNDERFLOW=FLOAT32_UNDERFLOW,
        BINS=BINS,
        LEVELS=LEVELS,
        BLOCK=BLOCK,
        num_warps=8,
    )
    return low, high
