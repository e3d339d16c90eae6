"""The math of the truncation samplers (top-n-sigma, typical-p, XTC): pure tensor functions.

Each sampler computes, per row, the interval ``[low, high]`` of logits it keeps (``-inf`` /
``+inf`` when a side is open): ``top_n_sigma_bounds``, ``typical_bounds``, ``xtc_bounds``.
``mask_outside`` (tensor form, for accelerators and Model Runner V2) and
``mask_outside_rows`` (host form, for CPU) then set every logit outside it to ``-inf``.
Splitting "which bounds" from "mask" lets each runner pick the faster mask without touching
the math. No vLLM, no state; the wiring is ``processors/truncation.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

NEG_INF = float("-inf")
POS_INF = float("inf")


class Scratch:
    """Reusable work buffers, one per name, grown to the largest block seen.

    On CPU, every fresh [rows, vocab] temporary costs page faults (glibc returns large freed
    blocks to the OS), which made typical-p's histogram search 2-3x slower than its
    arithmetic; a processor keeps one ``Scratch`` for its host-side blocks. ``Scratch.none()``
    allocates each time (accelerators have a caching allocator).
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.buffers: dict[str, torch.Tensor] = {}

    @classmethod
    def none(cls) -> Scratch:
        return cls(keep=False)

    def like(self, name: str, ref: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A buffer shaped like ``ref`` (``dtype`` default ``ref``'s), contents undefined."""
        dtype = dtype or ref.dtype
        if not self.keep:
            return torch.empty(ref.shape, dtype=dtype, device=ref.device)
        buf = self.buffers.get(name)
        rows, cols = ref.shape
        if buf is None or buf.dtype != dtype or buf.shape[0] < rows or buf.shape[1] != cols:
            buf = self.buffers[name] = torch.empty(
                max(rows, 0 if buf is None else buf.shape[0]), cols, dtype=dtype, device=ref.device
            )
        return buf[:rows]


def finite_mean_std(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population standard deviation of each row's finite logits (two passes).

    Masked tokens (``-inf``) are left out, as llama.cpp's top-n-sigma does.

    Args:
        logits: [rows, vocab] float32.

    Returns:
        ``(mean, std)``, each [rows] float32 (``nan`` for a row with no finite logit).
    """
    finite = logits > NEG_INF
    count = finite.sum(-1)
    mean = logits.where(finite, 0.0).sum(-1) / count
    deviation = (logits - mean.unsqueeze(1)).where(finite, 0.0)
    return mean, torch.linalg.vector_norm(deviation, dim=-1) / count.sqrt()


def mean_std_on_host(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``finite_mean_std`` for CPU tensors: unmasked rows (the usual case) skip the mask.

    Reads on the host which rows hold a ``-inf``; only those take the masked path.
    """
    width = logits.shape[1]
    mean = logits.sum(-1) / width
    masked = ~torch.isfinite(mean)
    if bool(masked.any()):
        mean[masked] = 0.0  # keeps the deviations below finite; fixed up after
    std = torch.linalg.vector_norm(logits - mean.unsqueeze(1), dim=-1) / math.sqrt(width)
    if bool(masked.any()):
        mean[masked], std[masked] = finite_mean_std(logits[masked])
    return mean, std


def top_n_sigma_bounds(
    logits: torch.Tensor, n: torch.Tensor, mean_std=finite_mean_std
) -> tuple[torch.Tensor, None]:
    """Top-n-sigma (Tang et al., 2024): keep ``l >= max(l) - n * std(l)``.

    ``std`` is the population standard deviation of the row's finite logits. The rule is
    invariant to temperature (both sides scale by ``1 / T``), so it keeps the same tokens
    before or after vLLM divides by temperature.

    Args:
        logits: [rows, vocab] float32.
        n: [rows] float32, ``> 0``; ``inf`` leaves the row whole.
        mean_std: ``finite_mean_std``, or ``mean_std_on_host`` for CPU tensors.

    Returns:
        ``(low, None)``: [rows] float32 lower bounds (no upper bound).

    Example::

        >>> top_n_sigma_bounds(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), torch.tensor([1.0]))[0]
        tensor([1.8820])
    """
    _, std = mean_std(logits)
    low = logits.amax(-1) - n * std  # inf * 0 (one finite logit) is nan: keep the row
    return low.nan_to_num_(nan=NEG_INF), None


# Relative widening of typical-p's bounds (8 float32 ulps), so rounding never drops a kept token.
TYPICAL_MARGIN = 8 * 2.0**-23
# exp(x) is 0 in float32 below this: tokens further below the top logit carry no mass.
FLOAT32_UNDERFLOW = 104.0
# ... and exp(-110) is under half the smallest float32 subnormal: 0 under any rounding.
EXP_IS_ZERO = 110.0


def typical_bounds(
    logits: torch.Tensor,
    mass: torch.Tensor,
    levels: int = 2,
    bins: int = 4096,
    scratch: Scratch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Locally typical sampling (Meister et al., 2022), as llama.cpp's ``typical`` sampler.

    With ``p = softmax(l)`` and entropy ``H = -sum(p * log p)``, tokens are ranked by
    ``d = |-log p - H|`` and kept, most typical first, until their probability first exceeds
    ``mass``. Since ``-log p = lse - l``, ``d = |l - c|`` with ``c = lse - H = sum(p * l)``,
    the expected logit: the kept set is the logit interval ``[c - s, c + s]`` for the
    smallest ``s`` whose interval holds more than ``mass``. ``s`` is found without sorting
    the vocabulary: ``levels`` rounds of a ``bins``-bucket histogram of ``d`` weighted by
    ``p``, each refining the bucket where the running mass crosses ``mass`` (2 x 4096
    buckets: ``2**-24`` of the row's range of ``d``). The bounds are widened by 8 float32
    ulps so rounding never drops a kept token: tokens that close to the boundary are kept
    together, like ties.

    Args:
        logits: [rows, vocab] float32.
        mass: [rows] float32 in (0, 1]; ``>= 1`` leaves the row whole.
        scratch: reusable [rows, vocab] buffers (see ``Scratch``); ``None`` allocates.

    Returns:
        ``(low, high)``: [rows] float32 bounds of the kept logits.

    Example::

        >>> low, high = typical_bounds(torch.tensor([[2.0, 1.0, 0.0, -4.0]]), torch.tensor([0.5]))
        >>> bool(low <= 2.0 <= high), bool(low <= 1.0 <= high)  # p = 0.66, 0.24, 0.09, 0.002
        (True, False)
    """
    work = scratch or Scratch.none()
    top, weight, centre, width, distance, target = _typicality(logits, mass, work)
    start = torch.zeros_like(centre)  # the bucket where the mass crosses starts here ...
    below = torch.zeros_like(target)  # ... after this much mass (float64: 150k-term sums)
    scaled = work.like("scaled", logits)
    bucket = work.like("bucket", logits, torch.int64)
    candidates = weight
    for level in range(levels):
        step = width / bins
        torch.sub(distance, start, out=scaled).div_(step).clamp_(0, bins - 1)
        bucket.copy_(scaled)  # truncation = floor: scaled >= 0
        hist = weight.new_zeros(logits.shape[0], bins)
        cumulative = hist.scatter_add_(1, bucket, candidates).double().cumsum_(-1)
        crossing = ((below + cumulative) <= target).sum(-1, keepdim=True).clamp_(max=bins - 1)
        below += cumulative.gather(1, (crossing - 1).clamp_(min=0)) * (crossing > 0)
        start = start + crossing * step
        width = step
        if level + 1 < levels:  # the next level sorts only the crossing bucket's tokens
            in_bucket = torch.eq(bucket, crossing, out=work.like("in_bucket", logits, torch.bool))
            candidates = torch.mul(weight, in_bucket, out=work.like("candidates", logits))
    radius = (start + width).squeeze(1).double()  # the last crossing bucket is kept whole
    return _typical_interval(top, centre, radius, mass)


def xtc_bounds(
    logits: torch.Tensor, threshold: torch.Tensor, apply: torch.Tensor
) -> tuple[None, torch.Tensor]:
    """XTC, "exclude top choices" (as llama.cpp's ``xtc`` sampler).

    In a row where ``apply`` is set, every token with ``p >= threshold`` (``p = softmax(l)``)
    except the least likely of them is removed: when two or more qualify the distribution
    loses its top choices, leaving the least likely qualifying token as the new top. In
    logits, ``p >= threshold`` is ``l >= lse + log(threshold)``; the kept tokens are those
    with ``l <= m``, ``m`` the smallest qualifying logit (tokens tied at ``m`` all stay).
    Masked tokens (``-inf``) never qualify.

    Args:
        logits: [rows, vocab] float32.
        threshold: [rows] float32 in [0, 0.5].
        apply: [rows] bool, this step's draw (``u < xtc_probability``).

    Returns:
        ``(None, high)``: [rows] float32 upper bounds (``inf``: row untouched).

    Example::

        >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
        >>> xtc_bounds(logits, torch.tensor([0.1]), torch.tensor([True]))[1].exp()
        tensor([0.1500])
    """
    cut = torch.logsumexp(logits, dim=-1) + threshold.log()
    cut = cut.clamp_(min=torch.finfo(logits.dtype).min).unsqueeze(1)  # -inf never qualifies
    least = logits.where(logits >= cut, POS_INF).amin(-1)
    return None, torch.where(apply, least, POS_INF)


def xtc_bounds_on_host(
    logits: torch.Tensor, threshold: torch.Tensor, scratch: Scratch
) -> tuple[None, torch.Tensor]:
    """``xtc_bounds`` for a CPU block whose rows all apply XTC this step: the same bounds,
    with reused buffers and one vectorized ``threshold_`` per row instead of a masked min."""
    top = logits.amax(-1, keepdim=True)
    shifted = torch.sub(logits, top, out=scratch.like("weight", logits))
    weight = shifted.exp_()
    lse = top.squeeze(1) + weight.sum(-1).log()
    cut = (lse + threshold.log()).clamp_(min=torch.finfo(logits.dtype).min)
    qualifying = scratch.like("qualifying", logits).copy_(logits)
    for row, bound in zip(qualifying, _just_below(cut.tolist()), strict=True):
        torch.nn.functional.threshold_(row, bound, POS_INF)  # below the cut: +inf
    return None, qualifying.amin(-1)


def mask_outside(
    logits: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None
) -> torch.Tensor:
    """Set ``logits[r, t] = -inf`` where ``logits[r, t] < low[r]`` or ``> high[r]``.

    The tensor form (one op per side, no host values): for accelerators and Model Runner V2.
    """
    if low is not None:
        logits.masked_fill_(logits < low.unsqueeze(1), NEG_INF)
    if high is not None:
        logits.masked_fill_(logits > high.unsqueeze(1), NEG_INF)
    return logits


def mask_outside_rows(
    logits: torch.Tensor,
    rows: list[int],
    low: list[float] | None,
    high: list[float] | None,
) -> torch.Tensor:
    """``mask_outside`` for host-known rows and bounds: one ``threshold_`` per row and side.

    On CPU, ``masked_fill_`` over a [64, 151,936] float32 block takes ~14 ms on this
    project's 2-core machine; ``torch.nn.functional.threshold_`` (a vectorized unary op) does
    a row in ~0.03 ms. ``threshold_`` keeps ``x > t``, so ``t`` is the float32 just below the
    bound (``x >= low`` exactly); the upper side runs on the negated row (negation is exact).

    Args:
        logits: [rows, vocab] float32 on the CPU.
        rows: the rows to edit; ``low`` / ``high`` give each one's bounds (float32 values).
    """
    below = _just_below(low) if low is not None else None
    above = _just_below([-value for value in high]) if high is not None else None
    for i, row_index in enumerate(rows):
        row = logits[row_index]
        if below is not None and below[i] != NEG_INF:
            torch.nn.functional.threshold_(row, below[i], NEG_INF)
        if above is not None and above[i] != NEG_INF:
            row.neg_()
            torch.nn.functional.threshold_(row, above[i], POS_INF)  # -inf once negated back
            row.neg_()
    return logits


def _just_below(values: list[float]) -> list[float]:
    """The float32 just below each value (``-inf`` stays ``-inf``; ``nan`` becomes ``-inf``)."""
    bounds = torch.tensor(values, dtype=torch.float32).nan_to_num_(nan=NEG_INF)
    return torch.nextafter(bounds, torch.tensor(NEG_INF)).tolist()


def uniform_hash(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """A uniform draw in [0, 1) from ``(seed, position)``: a counter-based generator.

    The same request seed and output position give the same draw in any batch, after
    preemption, under either model runner and on every rank; different positions give
    independent-looking draws (a 32-bit integer hash, applied twice, of the seed mixed with
    the position). vLLM's own V2 sampler keys its randomness on ``(seed, position)`` too.

    Args:
        seed: [rows] int64 in [0, 2**32).
        position: [rows] int64, the position of the token being sampled, in [0, 2**31).

    Returns:
        [rows] float64.
    """
    x = (_mix32(seed) ^ (position * 0x2545F491)) & 0xFFFFFFFF
    return _mix32(x).double() / 4294967296.0


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # 32-bit integer hash (constants from Wellons' hash-prospector); int64 products stay
    # below 2**59, so no step overflows.
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def typical_bounds_on_host(
    logits: torch.Tensor, mass: torch.Tensor, scratch: Scratch, bins: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """``typical_bounds`` for a CPU block (a few rows), exact: one histogram level, then the
    crossing bucket's few tokens sorted, every row of the block at once (no per-row loop).
    Ties at the boundary stay.

    The same math as ``typical_bounds`` in fewer, cheaper passes over the block (on CPU each
    pass costs about as much as the arithmetic; each helper below says how). NumPy runs the
    ``exp``, the bucket compare and the ``nonzero``: 2x, 10x and 2x faster than torch's on
    one core of this project's CPU machine (shared memory, no copies).
    """
    top, shifted, weight, centre, width, target = _typicality_on_host(logits, mass, scratch)
    bucket, offsets, crossing, below = _crossing_buckets(
        shifted, weight, centre, width, target, scratch, bins
    )
    rows, d, w = _crossing_bucket_members(
        shifted, weight, centre, bucket, offsets, crossing, scratch
    )
    radius = _crossing_radius(rows, d, w, below, target, width, bins)
    return _typical_interval(top, centre, radius, mass)


def _typicality_on_host(logits: torch.Tensor, mass: torch.Tensor, scratch: Scratch) -> tuple:
    """``_typicality`` for ``typical_bounds_on_host``: the top logit, ``l - top`` (clamped),
    ``p * Z``, ``c - top``, the range of ``d`` and the target mass ``mass * Z`` (float64).

    ``-inf`` clamped before the ``exp`` (so no ``0 * -inf``), the expected logit as one BLAS
    dot per row.
    """
    top = logits.amax(-1, keepdim=True)
    bottom = logits.amin(-1, keepdim=True)  # two passes: aminmax is 30x slower on CPU here
    shifted = torch.sub(logits, top, out=scratch.like("shifted", logits))
    shifted.clamp_(min=-EXP_IS_ZERO)  # exp is 0 there already; -inf would make nan
    weight = scratch.like("weight", logits)
    np.exp(shifted.numpy(), out=weight.numpy())
    total = weight.sum(-1, keepdim=True)
    dots = [torch.dot(weight[row], shifted[row]) for row in range(logits.shape[0])]
    centre = torch.stack(dots).view(-1, 1) / total  # c - top, <= 0
    lowest = (bottom - top).clamp_(min=-EXP_IS_ZERO)
    width = torch.maximum(-centre, centre - lowest).clamp_(min=1e-3)
    target = mass.unsqueeze(1).double() * total.double()
    return top, shifted, weight, centre, width, target


def _crossing_buckets(
    shifted: torch.Tensor,
    weight: torch.Tensor,
    centre: torch.Tensor,
    width: torch.Tensor,
    target: torch.Tensor,
    scratch: Scratch,
    bins: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One histogram level of the mass by ``d = |l - c|``: each token's flat bucket, each
    row's bucket offset, the bucket where the row's running mass crosses the target, and the
    mass of the buckets below it (float64).

    The bucket of every row's token in one flat int32 index (``bins + 1`` buckets a row:
    ``d == width`` may round to the last).
    """
    rows_ = shifted.shape[0]
    # bucket = floor(d * bins / width) + row * (bins + 1): one flat index for the block
    # (the row offsets are exact in float32, and floor stays monotone in d)
    scaled = torch.sub(shifted, centre, out=scratch.like("scaled", shifted)).abs_()
    offsets = torch.arange(rows_, dtype=torch.int32).unsqueeze(1) * (bins + 1)
    scaled.mul_(bins / width).add_(offsets)
    bucket = scratch.like("bucket", shifted, torch.int32).copy_(scaled)  # floor: >= 0
    index = scratch.like("index", shifted, torch.int64).copy_(bucket)  # scatter's index type
    hist = weight.new_zeros(rows_ * (bins + 1))
    hist.scatter_add_(0, index.view(-1), weight.view(-1))  # 1-D: 2x the 2-D scatter here
    cumulative = hist.view(rows_, bins + 1).double().cumsum_(-1)
    crossing = (cumulative <= target).sum(-1, keepdim=True).clamp_(max=bins)
    below = (cumulative.gather(1, (crossing - 1).clamp_(min=0)) * (crossing > 0)).squeeze(1)
    return bucket, offsets, crossing, below


def _crossing_bucket_members(
    shifted: torch.Tensor,
    weight: torch.Tensor,
    centre: torch.Tensor,
    bucket: torch.Tensor,
    offsets: torch.Tensor,
    crossing: torch.Tensor,
    scratch: Scratch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The crossing bucket's few tokens, all rows at once, sorted by row, then by ``d``:
    their row, ``d`` (recomputed only for them) and weight (float64)."""
    in_bucket = scratch.like("in_bucket", shifted, torch.bool)
    np.equal(bucket.numpy(), (crossing + offsets).int().numpy(), out=in_bucket.numpy())
    flat = torch.from_numpy(np.flatnonzero(in_bucket.numpy()))
    rows = flat // shifted.shape[1]
    d = (shifted.view(-1)[flat] - centre.squeeze(1)[rows]).abs_()  # as ``scaled`` had it
    order = d.argsort(stable=True)
    order = order[rows[order].argsort(stable=True)]
    rows, d = rows[order], d[order]
    w = weight.view(-1)[flat[order]].double()
    return rows, d, w


def _crossing_radius(
    rows: torch.Tensor,
    d: torch.Tensor,
    w: torch.Tensor,
    below: torch.Tensor,
    target: torch.Tensor,
    width: torch.Tensor,
    bins: int,
) -> torch.Tensor:
    """Each row's kept radius (float64): the ``d`` of its first crossing-bucket member where
    the running mass (from ``below``) passes the target."""
    rows_ = below.shape[0]
    counts = torch.bincount(rows, minlength=rows_)
    starts = counts.cumsum(0) - counts
    before = torch.cat([w.new_zeros(1), w.cumsum(0)])  # mass of the members before each
    running = below[rows] + before[1:] - before[starts[rows]]
    passed = torch.zeros(rows_, dtype=torch.int64).index_add_(
        0, rows, (running <= target.squeeze(1)[rows]).long()
    )
    first = starts + torch.minimum(passed, (counts - 1).clamp(min=0))
    radius = width.squeeze(1).double() / bins  # a row whose bucket is empty (never in practice)
    if d.numel():
        found = d.double()[first.clamp_(max=d.numel() - 1)]
        radius = torch.where(counts > 0, found, radius)
    return radius


def typical_bounds_native(
    logits: torch.Tensor,
    mass: torch.Tensor,
    scratch: Scratch,
    kernel: Any,
    mask: bool = False,
    threads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``typical_bounds_on_host`` in C (``truncation_host.c``, from ``host_kernel``): the same
    histogram search in four passes a row (``exp`` and sums from a sampled top, buckets,
    histogram, the crossing bucket sorted) instead of about twenty eager ones, and the same
    widened interval. ``mask``: also set every logit of ``logits`` outside it to ``-inf``,
    each row right after its search (while it is in cache): ``logits`` must then be the
    batch's own rows (a view), not a copy. ``logits``: a CPU block of float32 rows, each
    contiguous. ``threads``: at most how many of the process's OpenMP threads share the rows
    (``host_kernels.threads``; each with its own work row: the results do not depend on
    it)."""
    rows, width = logits.shape
    threads = max(1, min(threads, rows))
    ref = logits[:threads]
    work = scratch.like("w", ref)
    bucket = scratch.like("bucket16", ref, torch.int16)
    members = scratch.like("members", ref, torch.float64)  # (d, w) float32 pairs
    low = torch.empty(rows, dtype=torch.float32)
    high = torch.empty(rows, dtype=torch.float32)
    masses = mass.to(torch.float32).contiguous()
    kernel.typical_rows_parallel(
        logits.data_ptr(), logits.stride(0), rows, width, masses.data_ptr(),
        work.data_ptr(), bucket.data_ptr(), members.data_ptr(),
        low.data_ptr(), high.data_ptr(), int(mask), threads,
    )  # fmt: skip
    return low, high


def mask_outside_rows_native(
    logits: torch.Tensor, rows: list[int], low: torch.Tensor, high: torch.Tensor, kernel: Any
) -> torch.Tensor:
    """``mask_outside_rows`` in C: one pass a row (``threshold_`` takes four for both sides).
    ``logits``: [rows, vocab] float32 on the CPU with contiguous rows."""
    index = torch.tensor(rows, dtype=torch.int64)
    lows = low.to(torch.float32).contiguous()
    highs = high.to(torch.float32).contiguous()
    kernel.mask_outside_rows(
        logits.data_ptr(), logits.stride(0), index.data_ptr(), len(rows), logits.shape[1],
        lows.data_ptr(), highs.data_ptr(),
    )  # fmt: skip
    return logits


def host_kernel() -> Any:
    """The truncation samplers' C kernels (``truncation_host.c``) with their argument types,
    or ``None`` (no compiler, or ``CONSTRAINED_HOST_KERNELS=0``)."""
    import ctypes

    from constrained.processors.host_kernels import load

    lib = load("truncation_host")
    if lib is None:
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.typical_rows_parallel.argtypes = [pointer, size, size, size, *[pointer] * 6, size, size]
    lib.typical_rows_parallel.restype = None
    lib.parallel_threads.argtypes = []
    lib.parallel_threads.restype = size
    lib.mask_outside_rows.argtypes = [pointer, size, pointer, size, size, pointer, pointer]
    lib.mask_outside_rows.restype = None
    return lib


def _typicality(logits: torch.Tensor, mass: torch.Tensor, work: Scratch) -> tuple:
    """What both typical-p searches start from, per row: the top logit, the unnormalized
    probabilities ``p * Z``, ``c - top`` (the expected logit, shifted), the range of
    ``d = |l - c|``, ``d`` itself, and the target mass ``mass * Z`` (float64)."""
    top = logits.amax(-1, keepdim=True)
    shifted = torch.sub(logits, top, out=work.like("shifted", logits))
    weight = torch.exp(shifted, out=work.like("weight", logits))  # masked tokens weigh 0
    shifted.clamp_(min=-FLOAT32_UNDERFLOW)  # so 0 * shifted is 0, never nan
    total = weight.sum(-1, keepdim=True)
    # c - top, <= 0. A product into a work buffer, then a row sum: on CPU ~15x faster than
    # ``bmm`` of [rows, 1, vocab] by [rows, vocab, 1] (1.1 ms for 4 rows of 151,936 here)
    product = torch.mul(weight, shifted, out=work.like("product", logits))
    centre = product.sum(-1, keepdim=True) / total
    width = torch.maximum(-centre, centre - shifted.amin(-1, keepdim=True)).clamp_(min=1e-3)
    distance = shifted.sub_(centre).abs_()
    target = mass.unsqueeze(1).double() * total.double()
    return top, weight, centre, width, distance, target


def _typical_interval(
    top: torch.Tensor, centre: torch.Tensor, radius: torch.Tensor, mass: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept logits ``[c - radius, c + radius]``, widened by ``TYPICAL_MARGIN``; rows with
    ``mass >= 1`` keep everything."""
    centre = (top + centre).squeeze(1).double()
    radius = radius + TYPICAL_MARGIN * (centre.abs() + radius + 1.0)
    off = mass >= 1
    low = torch.where(off, NEG_INF, centre - radius)
    high = torch.where(off, POS_INF, centre + radius)
    return low.float(), high.float()
