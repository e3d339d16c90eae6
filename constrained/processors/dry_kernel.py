"""DRY under Model Runner V2 in two Triton launches per step (``dry_math`` is the reference).

``dry_penalize_kernel`` gives the logits ``dry_math.dry_penalize(logits, h, repeat_lengths(h,
...), ...)`` gives for the history ``h`` that ``history.device_history`` gathers, bit for bit,
without building ``h``: each program reads its row's tokens where they live (committed tokens
in ``req_states.all_token_ids``, the drafts before a speculative row in ``ctx.input_ids``).
The torch form is ~200 launches (one compare per repeat length it tries).

Distances count back from the row's newest token ``tok(0)`` (``tok(d) = -1`` past the row's
visible span or for a ``-1`` placeholder). For each earlier distance ``e >= 1``::

    K(e)  = the largest k with tok(e + j) == tok(j) >= 0 for every j < k
    limit = min(cap, distance of the newest breaker)    (no breaker: cap)
    n     = min(K(e), limit)
    l[tok(e - 1)] = min(l, l - multiplier * base ** min(n - allowed, exponent_cap))
            where n >= allowed, tok(e - 1) >= 0 and tok(e - 1) is not a breaker

(llama.cpp's ``rep_limit`` is the tokens since the newest breaker, else the whole history;
``K(e)`` never exceeds the real tokens, so "the whole history" is ``cap`` here.)

1. ``_dry_repeats_kernel`` [rows, chunks of distances]: a chunk's ``n`` (a vector scan that
   stops as soon as no repeat in the chunk still grows), the penalty in float64 and each
   candidate ``l - penalty`` from the untouched logits, into ``[rows, width]`` scratch;
2. ``_dry_min_kernel`` [rows, chunks]: ``atomic_min`` of the candidates into the logits (a
   token after several repeats takes its smallest result, as ``scatter_reduce_("amin")``).

Two launches because every candidate must read the logits before any is written.

``base ** e`` for an integer ``e`` is a binary exponentiation in double-double arithmetic
(``fma`` products), rounded once to float64: the correctly rounded power, as the float64
``pow`` the torch form calls (Triton's interpreter has no ``libdevice.pow``).

Example: llama.cpp's "a b c c b c y a b c" (ids 1 2 3 3 2 3 9 1 2 3, newest last), allowed
2, base 1.75, multiplier 0.8. At distance 7, "a b c" repeats the newest three tokens (n = 3):
the token after it, 'c', gets ``l[3] -= 0.8 * 1.75``; at distance 4, "b c" (n = 2): 'y' gets
``l[9] -= 0.8``; at distance 6, "c" alone (n = 1 < 2): nothing.
"""

from __future__ import annotations

import os

import torch
from vllm.triton_utils import tl, triton

# Triton's interpreter (the CPU V2 tests) runs each block op in numpy: wide blocks, few programs.
BLOCK = 4096 if os.environ.get("TRITON_INTERPRET") == "1" else 512
LIMIT = tl.constexpr(1e30)  # functional.PENALTY_LIMIT_LOGIT


@triton.jit
def _token(
    d, live, row, pos, local, slot, span, num_rows, tokens_ptr, tokens_stride, input_ids_ptr
):
    """``tok(d)``: the row's token ``d`` back from its newest (``-1`` past ``span``, and where
    not ``live``: nothing read); a committed one (``d >= local``) from the token table, a
    draft from the rows before."""
    valid = live & (d >= 0) & (d < span)
    committed = d >= local
    kept = tl.load(tokens_ptr + slot * tokens_stride + (pos - d), mask=valid & committed, other=-1)
    fed = tl.minimum(tl.maximum(row - d, 0), num_rows - 1)
    draft = tl.load(input_ids_ptr + fed, mask=valid & (d < local), other=-1)
    return tl.where(committed, kept.to(tl.int64), draft.to(tl.int64))


@triton.jit
def _is_breaker(token, list_row, table_ptr, table_width, HAS_BREAKERS: tl.constexpr):
    """Whether ``token`` (>= 0) is one of the row's single-token sequence breakers."""
    if HAS_BREAKERS:
        ok = (token >= 0) & (token < table_width)
        hit = tl.load(table_ptr + list_row * table_width + token, mask=ok, other=0) != 0
    else:
        hit = token != token  # no breakers: all False
    return hit


@triton.jit
def _dd_mul(ah, al, bh, bl):
    """Double-double product ``(ah + al) * (bh + bl)`` (the exact ``ah * bh`` by ``fma``)."""
    p = ah * bh
    err = tl.fma(ah, bh, -p) + (ah * bl + al * bh)
    hi = p + err
    return hi, err - (hi - p)


@triton.jit
def _pow_int(base, exponent):
    """``base ** exponent`` (float64 ``base``, int64 ``exponent >= 0`` per lane), rounded once."""
    rh = tl.full(exponent.shape, 1.0, tl.float64)
    rl = tl.zeros(exponent.shape, tl.float64)
    ph = tl.zeros(exponent.shape, tl.float64) + base
    pl = tl.zeros(exponent.shape, tl.float64)
    rest = exponent
    more = tl.max(rest, 0) > 0
    while more:
        mh, ml = _dd_mul(rh, rl, ph, pl)
        odd = (rest & 1) != 0
        rh = tl.where(odd, mh, rh)
        rl = tl.where(odd, ml, rl)
        ph, pl = _dd_mul(ph, pl, ph, pl)
        rest = rest >> 1
        more = tl.max(rest, 0) > 0
    return rh + rl


@triton.jit
def _dry_repeats_kernel(
    logits_ptr,
    logits_stride,
    num_rows,
    row_slots_ptr,
    pos_ptr,
    local_pos_ptr,
    input_ids_ptr,
    tokens_ptr,
    tokens_stride,
    window_ptr,
    cap_ptr,
    allowed_ptr,
    exponent_cap_ptr,
    multiplier_ptr,
    base_ptr,
    lists_ptr,
    table_ptr,
    table_width,
    width,
    candidate_ptr,
    target_ptr,
    spared_ptr,
    HAS_BREAKERS: tl.constexpr,
    HAS_SPARED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    local = tl.load(local_pos_ptr + row).to(tl.int64)
    window = tl.load(window_ptr + slot)
    cap = tl.load(cap_ptr + slot)
    visible = pos + 1
    span = tl.where(window > 0, tl.minimum(window, visible), visible)
    span = tl.where(cap > 0, tl.minimum(span, width), 0)  # cap 0: the slot has no DRY
    if HAS_SPARED:  # a structure row of a request that spares it (content_rows.py): no repeat
        span = tl.where(tl.load(spared_ptr + row) != 0, 0, span)
    list_row = tl.load(lists_ptr + slot)
    args = (row, pos, local, slot, span, num_rows, tokens_ptr, tokens_stride, input_ids_ptr)

    # limit: the newest breaker's distance, if nearer than cap (scanned only that far)
    offs = tl.arange(0, BLOCK)
    limit = cap
    start = cap * 0
    scan_end = tl.minimum(span, cap)
    while (start < scan_end) & (limit == cap):
        d = start + offs
        brk = _is_breaker(_token(d, d >= 0, *args), list_row, table_ptr, table_width, HAS_BREAKERS)
        limit = tl.minimum(limit, tl.min(tl.where(brk & (d < scan_end), d, cap), 0))
        start += BLOCK

    # n[e] = min(K(e), limit), one growing run per distance e of the chunk
    e = chunk * BLOCK + offs
    run = (e >= 1) & (e < span)
    n = tl.zeros([BLOCK], tl.int64)
    j = cap * 0
    alive = tl.max(tl.where(run, 1, 0), 0) > 0
    while alive & (j < limit):
        earlier = _token(e + j, run, *args)  # read where a repeat still grows
        # (``earlier >= 0``, not ``newest >= 0``: the interpreter turns a block bool & a
        # scalar bool into int32, which a load's mask refuses)
        run = run & (earlier == _token(j, j >= 0, *args)) & (earlier >= 0)
        n += tl.where(run, 1, 0)
        j += 1
        alive = tl.max(tl.where(run, 1, 0), 0) > 0

    allowed = tl.load(allowed_ptr + slot)
    hit = (n >= allowed) & (n > 0)
    following = _token(e - 1, hit, *args)  # read only after a long enough repeat
    hit = hit & (following >= 0)
    hit = hit & ~_is_breaker(following, list_row, table_ptr, table_width, HAS_BREAKERS)
    exponent = n - allowed
    exponent_cap = tl.load(exponent_cap_ptr + slot)
    exponent = tl.where((exponent_cap > 0) & (exponent > exponent_cap), exponent_cap, exponent)
    power = _pow_int(tl.load(base_ptr + slot).to(tl.float64), tl.where(hit, exponent, 0))
    penalty = (tl.load(multiplier_ptr + slot).to(tl.float64) * power).to(tl.float32)
    target = tl.where(hit, following, 0)
    current = tl.load(logits_ptr + row * logits_stride + target, mask=hit, other=0.0)
    ok = e < width
    # A finite push (``functional.PENALTY_LIMIT_LOGIT``): down to -1e30 at most.
    floor = tl.minimum(current, -LIMIT)
    tl.store(candidate_ptr + row * width + e, tl.maximum(current - penalty, floor), mask=ok)
    tl.store(target_ptr + row * width + e, tl.where(hit, following, -1).to(tl.int32), mask=ok)


@triton.jit
def _dry_min_kernel(
    logits_ptr, logits_stride, width, candidate_ptr, target_ptr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = e < width
    target = tl.load(target_ptr + row * width + e, mask=ok, other=-1)
    candidate = tl.load(candidate_ptr + row * width + e, mask=ok, other=0.0)
    hit = target >= 0
    tl.atomic_min(logits_ptr + row * logits_stride + tl.where(hit, target, 0), candidate, mask=hit)


def dry_penalize_kernel(
    logits: torch.Tensor,
    ctx: object,
    all_token_ids: torch.Tensor,
    columns: dict[str, torch.Tensor],
    breaker_table: torch.Tensor,
    width: int,
    spared: torch.Tensor | None = None,
) -> torch.Tensor:
    """DRY on a V2 step's logits in place, in two launches, no host reads.

    Args:
        logits: [rows, vocab] float32 (rows contiguous in the last dim).
        ctx: V2's ``LogitsContext`` (``expanded_idx_mapping``, ``pos``,
            ``expanded_local_pos``, ``input_ids``).
        all_token_ids: [slots, max_len] committed tokens (``req_states.all_token_ids.gpu``).
        columns: the processor's per-slot device columns (``dry_window``, ``dry_cap``,
            ``dry_allowed``, ``dry_exponent_cap``, ``dry_multiplier``, ``dry_base``,
            ``dry_breakers``); a slot with ``dry_cap`` 0 is left alone.
        breaker_table: [lists, vocab] bool, ``dry.BreakerMasks.table``.
        width: a host bound on any row's visible history (``history.device_width``).
        spared: [rows] int32, 1 for a row left as it is (``content_rows.row_flags``), or None.
    """
    rows = logits.shape[0]
    if rows == 0 or width < 2:
        return logits
    assert logits.stride(1) == 1, "dry_penalize_kernel: rows must be contiguous"
    device = logits.device
    candidate = torch.empty(rows, width, dtype=torch.float32, device=device)
    target = torch.empty(rows, width, dtype=torch.int32, device=device)
    grid = (rows, triton.cdiv(width, BLOCK))
    _launch_repeats(logits, ctx, all_token_ids, columns, breaker_table, width, candidate, target,
                    spared, grid)  # fmt: skip
    _dry_min_kernel[grid](logits, logits.stride(0), width, candidate, target, BLOCK=BLOCK)
    return logits


def _launch_repeats(
    logits: torch.Tensor,
    ctx: object,
    all_token_ids: torch.Tensor,
    columns: dict[str, torch.Tensor],
    breaker_table: torch.Tensor,
    width: int,
    candidate: torch.Tensor,
    target: torch.Tensor,
    spared: torch.Tensor | None,
    grid: tuple[int, int],
) -> None:
    """Launch 1, ``_dry_repeats_kernel``: each row's candidates and their targets."""
    rows = logits.shape[0]
    has_breakers = breaker_table.shape[0] > 0
    table = breaker_table.view(torch.uint8) if has_breakers else columns["dry_breakers"]
    _dry_repeats_kernel[grid](
        logits,
        logits.stride(0),
        rows,
        ctx.expanded_idx_mapping,
        ctx.pos,
        ctx.expanded_local_pos,
        ctx.input_ids,
        all_token_ids,
        all_token_ids.stride(0),
        columns["dry_window"],
        columns["dry_cap"],
        columns["dry_allowed"],
        columns["dry_exponent_cap"],
        columns["dry_multiplier"],
        columns["dry_base"],
        columns["dry_breakers"],
        table,
        breaker_table.shape[1],
        width,
        candidate,
        target,
        spared if spared is not None else ctx.expanded_idx_mapping,
        HAS_BREAKERS=has_breakers,
        HAS_SPARED=spared is not None,
        BLOCK=BLOCK,
    )
