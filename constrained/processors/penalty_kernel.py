"""Bias, penalties and min-p under Model Runner V2: at most three Triton launches per step.

Model Runner V2 needs Triton, so this runs wherever V2 does. It follows vLLM's own V2
``_penalties_kernel`` (same float32 operations in the same order, so the same bits), reading
our packed per-slot counts (``device_counts``) instead of vLLM's tables, and editing the logits
in place: no ``[rows, vocab]`` temporaries.

For logits row ``r`` of slot ``s`` with ``k = local_pos[r]`` (the drafts before it, fed at rows
``r-k+1 .. r``), per token ``t``::

    packed  = counts[s, t] + #{drafts == t} - (with a window: the tokens those drafts push out)
    output  = packed & output_bits(unit[s]);  prompt = packed - output
    seen    = output > 0 or prompt != 0
    l       = l * (1 / r if l > 0 else r) if seen     (repetition r, kept within +-1e30)
    l       = l - f * output - p * (output > 0)        (frequency f, presence p)

A draft id < 0 (vLLM's placeholder for a step that starts inside the prefill) matches no token
and pushes nothing out.
"""

from __future__ import annotations

import torch
from vllm.triton_utils import tl, triton

BLOCK_SIZE = 8192
# ``functional.PENALTY_LIMIT_LOGIT``: a repetition penalty moves a logit no further.
LIMIT = tl.constexpr(1e30)


# ---- the fused elementwise step (bias, penalties, min-p) -------------------------------------
#
# One decoding step of logit_bias + penalties + min_p under V2 is at most three launches:
#
#   1. ``_prep_kernel`` [rows]: the row's sparse logit bias (atomic adds: padding entries add
#      the neutral -0.0), and, on the request's first row, the tokens committed since the last
#      step counted into the packed table (what ``DeviceCounts.catch_up`` did in ~25 torch ops).
#   2. ``_penalties_max_kernel`` [rows, blocks]: the penalties (the kernel above, same float32
#      operations), then each block's max of the result when min-p follows in this step.
#   3. ``_min_p_mask_kernel`` [rows, blocks]: the row's max from the block maxima, then
#      ``l < max + T * log(min_p)`` set to -inf (stores only the entries it masks).
#
# Each is launched only when some row of the call needs it (decided on the host).

MAX_BLOCKS = 64  # vocab up to 64 * BLOCK_SIZE = 524,288 for the block maxima


@triton.jit
def _prep_kernel(
    logits_ptr,
    logits_stride,
    row_slots_ptr,
    local_pos_ptr,
    bias_ids_ptr,
    bias_ptr,
    bias_stride,
    num_bias,
    repetition_ptr,
    frequency_ptr,
    presence_ptr,
    unit_ptr,
    window_ptr,
    counts_ptr,
    counts_stride,
    counted_ptr,
    total_len_ptr,
    prompt_len_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    row_flags_ptr,
    HAS_BIAS: tl.constexpr,
    HAS_PENALTIES: tl.constexpr,
    HAS_ROW_FLAGS: tl.constexpr,
    BIAS_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    if HAS_BIAS:
        k = tl.arange(0, BIAS_BLOCK)
        used = k < num_bias
        ids = tl.load(bias_ids_ptr + slot * bias_stride + k, mask=used, other=0)
        bias = tl.load(bias_ptr + slot * bias_stride + k, mask=used, other=-0.0)
        tl.atomic_add(logits_ptr + row * logits_stride + ids, bias, mask=used)
    if HAS_PENALTIES:
        rep = tl.load(repetition_ptr + slot)
        freq = tl.load(frequency_ptr + slot)
        pres = tl.load(presence_ptr + slot)
        local = tl.load(local_pos_ptr + row)
        fed = False
        if HAS_ROW_FLAGS:  # a fed request's counts come from the host (device_counts.FedSlot)
            fed = (tl.load(row_flags_ptr + row) & 2) != 0
        if (local == 0) and (not fed) and ((rep != 1.0) or (freq != 0.0) or (pres != 0.0)):
            counted = tl.load(counted_ptr + slot)
            total = tl.load(total_len_ptr + slot).to(tl.int64)
            window = tl.load(window_ptr + slot).to(tl.int64)
            unit = tl.load(unit_ptr + slot)
            prompt_len = tl.load(prompt_len_ptr + slot).to(tl.int64)
            tokens = all_token_ids_ptr + slot * all_token_ids_stride
            for position in tl.range(counted, total):
                token = tl.load(tokens + position).to(tl.int64)
                tl.atomic_add(counts_ptr + slot * counts_stride + token, 1)
                leaving = position - window
                if (window > 0) and (leaving >= 0):
                    old = tl.load(tokens + leaving).to(tl.int64)
                    weight = tl.where(leaving < prompt_len, unit, 1)
                    tl.atomic_add(counts_ptr + slot * counts_stride + old, -weight)
            tl.store(counted_ptr + slot, tl.maximum(counted, total))


@triton.jit
def _penalties_max_kernel(
    logits_ptr,
    logits_stride,
    row_slots_ptr,
    input_ids_ptr,
    local_pos_ptr,
    repetition_ptr,
    frequency_ptr,
    presence_ptr,
    unit_ptr,
    window_ptr,
    counts_ptr,
    counts_stride,
    counted_ptr,
    prompt_len_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    log_min_p_ptr,
    block_max_ptr,
    vocab_size,
    row_flags_ptr,
    HAS_PENALTIES: tl.constexpr,
    HAS_ROW_FLAGS: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    # Bound on every path: Triton's compiler (unlike its interpreter) compiles the runtime
    # ``if penalized:`` below even when HAS_PENALTIES is off.
    rep, freq, pres = 1.0, 0.0, 0.0
    penalized = False
    if HAS_PENALTIES:
        rep = tl.load(repetition_ptr + slot)
        freq = tl.load(frequency_ptr + slot)
        pres = tl.load(presence_ptr + slot)
        penalized = (rep != 1.0) or (freq != 0.0) or (pres != 0.0)
    flags = 0
    if HAS_ROW_FLAGS:  # SPARE (1): a structure row; FED (2); bit 2 + j: draft j is content
        flags = tl.load(row_flags_ptr + row)
        penalized = penalized and ((flags & 1) == 0)
    fed = (flags & 2) != 0
    needs_max = False
    if HAS_MIN_P:
        needs_max = tl.load(log_min_p_ptr + slot) != float("-inf")
    if (not penalized) and (not needs_max):
        return

    block = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = block < vocab_size
    logits = tl.load(logits_ptr + row * logits_stride + block, mask=mask, other=float("-inf"))
    logits = logits.to(tl.float32)
    if penalized:
        packed = tl.load(counts_ptr + slot * counts_stride + block, mask=mask, other=0)
        unit = tl.load(unit_ptr + slot)
        window = tl.load(window_ptr + slot)
        counted = tl.load(counted_ptr + slot)
        prompt_len = tl.load(prompt_len_ptr + slot)
        local = tl.load(local_pos_ptr + row)
        first = row - local
        for k in tl.range(local):
            draft = tl.load(input_ids_ptr + first + k + 1)
            valid = draft >= 0
            counted_draft = valid and ((not fed) or (((flags >> (2 + k)) & 1) != 0))
            packed += ((block == draft) & counted_draft).to(tl.int32)
            leaving = counted + k - window
            if (window > 0) and valid and (not fed) and (leaving >= 0):
                if leaving < counted:  # a committed token leaves the window
                    # both int32 (the two tables' id types differ; Triton's compiler wants
                    # one type out of the branch)
                    old = tl.load(all_token_ids_ptr + slot * all_token_ids_stride + leaving)
                    old = old.to(tl.int32)
                else:  # a window shorter than the drafts: an earlier draft leaves
                    old = tl.load(input_ids_ptr + first + 1 + leaving - counted).to(tl.int32)
                weight = tl.where(leaving < prompt_len, unit, 1)
                packed -= (block == old).to(tl.int32) * weight

        output_bits = tl.where(unit > 1, unit - 1, -1)
        output = packed & output_bits
        output_seen = output > 0
        seen = output_seen | ((packed - output) != 0)
        if rep != 1.0:  # a branch, as vLLM's: see below
            scale = tl.where(seen, rep, 1.0)
            low = tl.minimum(logits, -LIMIT)
            high = tl.maximum(logits, LIMIT)
            logits *= tl.where(logits > 0, 1.0 / scale, scale)
            logits = tl.minimum(tl.maximum(logits, low), high)
        # The branch keeps the product rounded on its own, as in vLLM's kernel: unbranched,
        # the compiler contracted it with the frequency term into one FMA on CUDA and our row
        # differed from vLLM's by 1 ulp (seen on an H200; the interpreter has no FMA).
        logits -= freq * output
        logits -= pres * output_seen
        tl.store(logits_ptr + row * logits_stride + block, logits, mask=mask)
    if needs_max:
        tl.store(block_max_ptr + row * MAX_BLOCKS + tl.program_id(1), tl.max(logits, axis=0))


@triton.jit
def _min_p_mask_kernel(
    logits_ptr,
    logits_stride,
    row_slots_ptr,
    log_min_p_ptr,
    block_max_ptr,
    num_blocks,
    vocab_size,
    MAX_BLOCKS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    log_min_p = tl.load(log_min_p_ptr + slot)
    if log_min_p == float("-inf"):
        return
    b = tl.arange(0, MAX_BLOCKS)
    maxima = tl.load(block_max_ptr + row * MAX_BLOCKS + b, mask=b < num_blocks, other=float("-inf"))
    threshold = tl.max(maxima, axis=0) + log_min_p
    block = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = block < vocab_size
    logits = tl.load(logits_ptr + row * logits_stride + block, mask=mask, other=0.0)
    drop = mask & (logits < threshold)
    tl.store(logits_ptr + row * logits_stride + block, float("-inf"), mask=drop)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def apply_fused_elementwise(
    logits: torch.Tensor,
    ctx: object,
    *,
    bias: tuple[torch.Tensor, torch.Tensor] | None,
    penalties: dict | None,
    log_min_p: torch.Tensor | None,
    scratch: dict,
    row_flags: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bias, penalties and min-p (each optional) on ``logits`` in place, in that order, in
    at most three launches (see above). No host reads.

    Args:
        logits: [rows, vocab] float32.
        ctx: V2's ``LogitsContext`` (``expanded_idx_mapping``, ``expanded_local_pos``,
            ``input_ids``).
        bias: the slot table's ``(token_ids, biases)``, [slots, K] each, padded with -0.0.
        penalties: the slot tables and counts (``repetition``, ``frequency``, ``presence``,
            ``unit``, ``window``, ``counts``, ``counted``, ``total_len``, ``prompt_len``,
            ``all_token_ids``), or None.
        log_min_p: [slots] float32 ``T * log(min_p)`` (-inf: off), or None.
        scratch: a dict the caller keeps, for the block-maxima buffer.
        row_flags: [rows] int32 (``device_counts.SPARE`` / ``FED`` / content-draft bits:
            requests whose penalties spare the structure), or None: every row as above.
    """
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    num_blocks = _vocab_blocks(vocab)
    if bias is not None or penalties is not None:
        _launch_prep(logits, ctx, bias, penalties, row_flags)
    if penalties is None and log_min_p is None:
        return logits
    block_max = _block_max_buffer(scratch, rows, logits.device) if log_min_p is not None else None
    _launch_penalties_max(logits, ctx, penalties, log_min_p, block_max, num_blocks, row_flags)
    if log_min_p is not None:
        _launch_min_p_mask(logits, ctx, log_min_p, block_max, num_blocks)
    return logits


def _vocab_blocks(vocab: int) -> int:
    """How many ``BLOCK_SIZE`` blocks cover the vocabulary: at most ``MAX_BLOCKS``, the
    width of the block-maxima buffer."""
    num_blocks = triton.cdiv(vocab, BLOCK_SIZE)
    if num_blocks > MAX_BLOCKS:
        raise ValueError(f"vocab {vocab} wider than {MAX_BLOCKS * BLOCK_SIZE}")
    return num_blocks


def _block_max_buffer(scratch: dict, rows: int, device: torch.device) -> torch.Tensor:
    """The [rows, MAX_BLOCKS] float32 buffer of block maxima, kept in ``scratch`` and grown
    only when a call has more rows (at least 8 rows)."""
    block_max = scratch.get("block_max")
    if block_max is None or block_max.shape[0] < rows:
        block_max = torch.empty(max(rows, 8), MAX_BLOCKS, dtype=torch.float32, device=device)
        scratch["block_max"] = block_max
    return block_max


# In the launches below, a table the step does not have is never read (its ``HAS_*`` flag is
# off); a tensor of the right kind stands in for its pointer: the logits for a float table,
# the row slots for an integer one.


def _launch_prep(
    logits: torch.Tensor,
    ctx: object,
    bias: tuple[torch.Tensor, torch.Tensor] | None,
    penalties: dict | None,
    row_flags: torch.Tensor | None,
) -> None:
    """Launch 1, ``_prep_kernel`` [rows]: the sparse bias added, and the tokens committed
    since the last step counted into the packed table."""
    slots = ctx.expanded_idx_mapping
    p = penalties or {}
    dummy_f = logits
    bias_ids, bias_values = bias if bias is not None else (slots, dummy_f)
    _prep_kernel[(logits.shape[0],)](
        logits,
        logits.stride(0),
        slots,
        ctx.expanded_local_pos,
        bias_ids,
        bias_values,
        bias_ids.stride(0) if bias is not None else 0,
        bias_ids.shape[1] if bias is not None else 0,
        p.get("repetition", dummy_f),
        p.get("frequency", dummy_f),
        p.get("presence", dummy_f),
        p.get("unit", slots),
        p.get("window", slots),
        p.get("counts", slots),
        p["counts"].stride(0) if penalties is not None else 0,
        p.get("counted", slots),
        p.get("total_len", slots),
        p.get("prompt_len", slots),
        p.get("all_token_ids", slots),
        p["all_token_ids"].stride(0) if penalties is not None else 0,
        row_flags if row_flags is not None else slots,
        HAS_BIAS=bias is not None,
        HAS_PENALTIES=penalties is not None,
        HAS_ROW_FLAGS=row_flags is not None,
        BIAS_BLOCK=_next_pow2(bias_ids.shape[1]) if bias is not None else 1,
    )


def _launch_penalties_max(
    logits: torch.Tensor,
    ctx: object,
    penalties: dict | None,
    log_min_p: torch.Tensor | None,
    block_max: torch.Tensor | None,
    num_blocks: int,
    row_flags: torch.Tensor | None,
) -> None:
    """Launch 2, ``_penalties_max_kernel`` [rows, blocks]: the penalties, then each block's
    maximum into ``block_max`` when min-p follows."""
    rows, vocab = logits.shape
    slots = ctx.expanded_idx_mapping
    p = penalties or {}
    dummy_f = logits
    _penalties_max_kernel[(rows, num_blocks)](
        logits,
        logits.stride(0),
        slots,
        ctx.input_ids,
        ctx.expanded_local_pos,
        p.get("repetition", dummy_f),
        p.get("frequency", dummy_f),
        p.get("presence", dummy_f),
        p.get("unit", slots),
        p.get("window", slots),
        p.get("counts", slots),
        p["counts"].stride(0) if penalties is not None else 0,
        p.get("counted", slots),
        p.get("prompt_len", slots),
        p.get("all_token_ids", slots),
        p["all_token_ids"].stride(0) if penalties is not None else 0,
        log_min_p if log_min_p is not None else dummy_f,
        block_max if log_min_p is not None else dummy_f,
        vocab,
        row_flags if row_flags is not None else slots,
        HAS_PENALTIES=penalties is not None,
        HAS_ROW_FLAGS=row_flags is not None,
        HAS_MIN_P=log_min_p is not None,
        MAX_BLOCKS=MAX_BLOCKS,
        BLOCK_SIZE=BLOCK_SIZE,
    )


def _launch_min_p_mask(
    logits: torch.Tensor,
    ctx: object,
    log_min_p: torch.Tensor,
    block_max: torch.Tensor,
    num_blocks: int,
) -> None:
    """Launch 3, ``_min_p_mask_kernel`` [rows, blocks]: each row's maximum from its block
    maxima, then the logits below ``max + T * log(min_p)`` set to -inf."""
    rows, vocab = logits.shape
    _min_p_mask_kernel[(rows, num_blocks)](
        logits,
        logits.stride(0),
        ctx.expanded_idx_mapping,
        log_min_p,
        block_max,
        num_blocks,
        vocab,
        MAX_BLOCKS=MAX_BLOCKS,
        BLOCK_SIZE=BLOCK_SIZE,
    )
