"""The penalties under Model Runner V2: one Triton kernel over packed device counts.

Model Runner V2 needs Triton, so this runs wherever V2 does. It follows vLLM's own V2
``_penalties_kernel`` (same float32 operations in the same order, so the same bits), reading
our packed per-slot counts (``device_counts``) instead of vLLM's tables, and editing the logits
in place: no ``[rows, vocab]`` temporaries.

For logits row ``r`` of slot ``s`` with ``k = local_pos[r]`` (the drafts before it, fed at rows
``r-k+1 .. r``), per token ``t``::

    packed  = counts[s, t] + #{drafts == t} - (with a window: the tokens those drafts push out)
    output  = packed & output_bits(unit[s]);  prompt = packed - output
    seen    = output > 0 or prompt != 0
    l       = l * (1 / r if l > 0 else r) if seen     (repetition r)
    l       = l - f * output - p * (output > 0)        (frequency f, presence p)

A draft id < 0 (vLLM's placeholder for a step that starts inside the prefill) matches no token
and pushes nothing out.
"""

from __future__ import annotations

import torch
from vllm.triton_utils import tl, triton

BLOCK_SIZE = 8192


@triton.jit
def _packed_penalties_kernel(
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
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    rep = tl.load(repetition_ptr + slot)
    freq = tl.load(frequency_ptr + slot)
    pres = tl.load(presence_ptr + slot)
    if (rep == 1.0) and (freq == 0.0) and (pres == 0.0):
        return  # not ours, or neutral: leave the row untouched

    block = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = block < vocab_size
    logits = tl.load(logits_ptr + row * logits_stride + block, mask=mask).to(tl.float32)
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
        packed += (block == draft).to(tl.int32)
        leaving = counted + k - window
        if (window > 0) and valid and (leaving >= 0):
            if leaving < counted:  # a committed token leaves the window
                old = tl.load(all_token_ids_ptr + slot * all_token_ids_stride + leaving)
            else:  # a window shorter than the drafts: an earlier draft leaves
                old = tl.load(input_ids_ptr + first + 1 + leaving - counted)
            weight = tl.where(leaving < prompt_len, unit, 1)
            packed -= (block == old).to(tl.int32) * weight

    output_bits = tl.where(unit > 1, unit - 1, -1)
    output = packed & output_bits
    output_seen = output > 0
    seen = output_seen | ((packed - output) != 0)
    scale = tl.where(seen, rep, 1.0)
    logits *= tl.where(logits > 0, 1.0 / scale, scale)
    logits -= freq * output
    logits -= pres * output_seen
    tl.store(logits_ptr + row * logits_stride + block, logits, mask=mask)


def apply_packed_penalties(
    logits: torch.Tensor,
    row_slots: torch.Tensor,
    input_ids: torch.Tensor,
    local_pos: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    unit: torch.Tensor,
    window: torch.Tensor,
    counts: torch.Tensor,
    counted: torch.Tensor,
    prompt_len: torch.Tensor,
    all_token_ids: torch.Tensor,
) -> torch.Tensor:
    """Apply the penalties to ``logits`` in place (see the module docstring).

    Args:
        logits: [rows, vocab] float32.
        row_slots, input_ids, local_pos: [rows], V2's ``LogitsContext`` fields.
        repetition, frequency, presence: [slots] float32; (1, 0, 0) leaves a row untouched.
        unit, window: [slots] int32, the prompt's packing unit and the window (0: none).
        counts: [slots, vocab] int32 packed counts of the committed tokens.
        counted: [slots] committed tokens counted; prompt_len: [slots].
        all_token_ids: [slots, max_len] committed token ids.
    """
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    _packed_penalties_kernel[(rows, triton.cdiv(vocab, BLOCK_SIZE))](
        logits,
        logits.stride(0),
        row_slots,
        input_ids,
        local_pos,
        repetition,
        frequency,
        presence,
        unit,
        window,
        counts,
        counts.stride(0),
        counted,
        prompt_len,
        all_token_ids,
        all_token_ids.stride(0),
        vocab,
        BLOCK_SIZE=BLOCK_SIZE,
    )
    return logits
