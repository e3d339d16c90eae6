"""No-repeat-ngram under Model Runner V2: one Triton launch per step.

``ban_repeated_ngrams_kernel`` does, one program per logits row, what the torch path does in
about 70 launches (``history.device_history``, then ``ngram_math.repeated_ngram_bans``, then
``ngram_math.ban_tokens``), with the same result bit for bit: the same banned tokens set to
``-inf``, the other logits untouched, and a row that the bans would empty left as it was.

Row ``r`` of slot ``s`` sees the output tokens at positions ``first = prompt_len[s]`` up to its
own input position ``pos[r]``, the last ``span`` of them (``ngram_window``; 0: all), committed
ones from ``all_token_ids``, the ``local[r]`` drafts fed before it from ``input_ids`` (a ``-1``
placeholder is no token). In the torch path's ``[rows, width]`` history (right-aligned,
``width`` the host bound of ``history.device_width``) that is column ``j``'s token::

    h[j] = token at position  first + j - width + visible,  visible = max(pos + 1 - first, 0)
           (-1 for j < 0 or j < width - span)
    banned[e] = h[e] >= 0  and  h[e - m] == h[width - m] >= 0  for m = 1 .. n - 1
                and h[e] not in the whitelist;  nothing when n < 1 or n > width

The program computes ``h`` on the fly (a few loads per column, nothing ``[rows, width]``-sized
is kept but the bans), then in four phases separated by barriers: (1) the bans and the
original logits of the banned tokens, into two ``[rows, width]`` scratch rows; (2) ``-inf``
into each banned token; (3) whether any logit of the row is left (``!= -inf``, stopping
loads at the first block that has one); (4) if none, the originals written back. A token
banned twice stores the same values twice: no atomics, the same row on every run.

Example: ``n = 3``, output ``5 6 7 5 6``: the prefix is ``5 6``, which stood before ``7``
(column 2), so token 7 gets ``-inf``; with ``ngram_whitelist = [7]`` nothing does.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.triton_utils import tl, triton

# Triton's interpreter (the CPU V2 tests) runs each block op in numpy: wide blocks, few ops.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HISTORY_BLOCK = 1024 if _INTERPRETED else 256
VOCAB_BLOCK = 8192 if _INTERPRETED else 2048


@triton.jit
def _history_token(
    col,
    row,
    slot,
    pos,
    local,
    first,
    visible,
    span,
    width,
    last_row,
    all_token_ids_ptr,
    all_token_ids_stride,
    max_len,
    input_ids_ptr,
):
    """Column ``col`` of the row's history (``history.device_history``): committed tokens
    from ``all_token_ids``, the drafts fed before the row from ``input_ids``, ``-1`` where
    the row has no token (before the output or the window, a ``-1`` placeholder)."""
    index = col - width + visible
    position = first + index
    valid = (col >= 0) & (index >= visible - span)
    is_committed = position <= pos - local
    at = tl.minimum(tl.maximum(position, 0), max_len - 1)
    committed = tl.load(
        all_token_ids_ptr + slot * all_token_ids_stride + at,
        mask=valid & is_committed,
        other=-1,
    )
    back = pos - position  # how many rows back this request fed that draft
    draft = tl.load(
        input_ids_ptr + tl.minimum(tl.maximum(row - back, 0), last_row),
        mask=valid & ~is_committed,
        other=-1,
    )
    token = tl.where(is_committed, committed.to(tl.int64), draft.to(tl.int64))
    return tl.where(valid, token, -1)


@triton.jit
def _no_repeat_ngram_kernel(
    logits_ptr,
    logits_stride,
    vocab,
    row_slots_ptr,
    pos_ptr,
    local_pos_ptr,
    input_ids_ptr,
    last_row,
    all_token_ids_ptr,
    all_token_ids_stride,
    max_len,
    prompt_len_ptr,
    n_ptr,
    window_ptr,
    whitelist_ptr,
    whitelist_stride,
    num_whitelist,
    banned_ptr,
    original_ptr,
    width,
    spared_ptr,
    HAS_SPARED: tl.constexpr,
    BLOCK: tl.constexpr,
    VOCAB_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(row_slots_ptr + row).to(tl.int64)
    n = tl.load(n_ptr + slot).to(tl.int64)
    if HAS_SPARED:  # a structure row of a request that spares it (content_rows.py)
        n = tl.where(tl.load(spared_ptr + row) != 0, 0, n)
    if (n < 1) or (n > width):  # the option off, or an n-gram longer than any history
        return
    pos = tl.load(pos_ptr + row).to(tl.int64)
    local = tl.load(local_pos_ptr + row).to(tl.int64)
    first = tl.load(prompt_len_ptr + slot).to(tl.int64)
    visible = tl.maximum(pos + 1 - first, 0)
    window = tl.load(window_ptr + slot).to(tl.int64)
    span = tl.where(window > 0, tl.minimum(window, visible), visible)
    logits_row = logits_ptr + row * logits_stride
    scratch = row * width
    offs = tl.arange(0, BLOCK)
    any_ban = tl.zeros([BLOCK], tl.int32)
    # (1) the bans and the banned tokens' original logits (reads only)
    for start in tl.range(0, width, BLOCK):
        col = start + offs
        inside = col < width
        token = _history_token(
            col, row, slot, pos, local, first, visible, span, width, last_row,
            all_token_ids_ptr, all_token_ids_stride, max_len, input_ids_ptr,
        )  # fmt: skip
        banned = inside & (token >= 0)
        for m in tl.range(1, n):
            prefix = _history_token(
                width - m, row, slot, pos, local, first, visible, span, width, last_row,
                all_token_ids_ptr, all_token_ids_stride, max_len, input_ids_ptr,
            )  # fmt: skip
            before = _history_token(
                col - m, row, slot, pos, local, first, visible, span, width, last_row,
                all_token_ids_ptr, all_token_ids_stride, max_len, input_ids_ptr,
            )  # fmt: skip
            banned = banned & (before == prefix) & (before >= 0)  # so prefix >= 0
        for k in tl.range(0, num_whitelist):
            exempt = tl.load(whitelist_ptr + slot * whitelist_stride + k).to(tl.int64)
            banned = banned & (token != exempt)
        original = tl.load(logits_row + token, mask=banned, other=0.0)
        tl.store(banned_ptr + scratch + col, tl.where(banned, token, -1).to(tl.int32), mask=inside)
        tl.store(original_ptr + scratch + col, original, mask=inside)
        any_ban += banned.to(tl.int32)
    if tl.sum(any_ban, 0) > 0:
        tl.debug_barrier()  # every original read before any token is banned
        # (2) ban
        for start in tl.range(0, width, BLOCK):
            col = start + offs
            token = tl.load(banned_ptr + scratch + col, mask=col < width, other=-1)
            tl.store(
                logits_row + token, tl.full([BLOCK], float("-inf"), tl.float32), mask=token >= 0
            )
        tl.debug_barrier()
        # (3) is any logit left? Loads stop at the first block that has one.
        voffs = tl.arange(0, VOCAB_BLOCK)
        left = tl.zeros([VOCAB_BLOCK], tl.int32)
        for start in tl.range(0, vocab, VOCAB_BLOCK):
            idx = start + voffs
            end = tl.where(tl.sum(left, 0) == 0, vocab, 0)
            x = tl.load(logits_row + idx, mask=idx < end, other=float("-inf"))
            left += (x != float("-inf")).to(tl.int32)  # nan counts as left, as amax's nan
        if tl.sum(left, 0) == 0:
            # (4) the bans would empty the row: it keeps its banned tokens
            for start in tl.range(0, width, BLOCK):
                col = start + offs
                token = tl.load(banned_ptr + scratch + col, mask=col < width, other=-1)
                original = tl.load(original_ptr + scratch + col, mask=token >= 0, other=0.0)
                tl.store(logits_row + token, original, mask=token >= 0)


def ban_repeated_ngrams_kernel(
    logits: torch.Tensor,
    ctx: Any,
    all_token_ids: torch.Tensor,
    prompt_len: torch.Tensor,
    n: torch.Tensor,
    window: torch.Tensor,
    whitelist: torch.Tensor,
    width: int,
    spared: torch.Tensor | None = None,
) -> torch.Tensor:
    """No-repeat-ngram's bans for V2 logits rows, in place, in one launch (module docstring).

    Args:
        logits: [rows, vocab] on a Triton device (rows contiguous in the last dim).
        ctx: V2's ``LogitsContext`` (``expanded_idx_mapping``, ``pos``,
            ``expanded_local_pos``, ``input_ids``).
        all_token_ids: [slots, max_len] committed tokens; prompt_len: [slots].
        n, window: [slots] int64 (``ngram_n``: 0 off; ``ngram_window``: 0 all);
            whitelist: [slots, K] int64, ``-1`` padded.
        width: the host bound of any row's history (``history.device_width``); 0: nothing.
        spared: [rows] int32, 1 for a row left as it is (``content_rows.row_flags``), or None.

    Example: with ``width = 5``, a row of slot ``s`` (``n[s] = 3``) whose output is
    ``5 6 7 5 6`` gets ``logits[r, 7] = -inf``.
    """
    rows, vocab = logits.shape
    if rows == 0 or width == 0:
        return logits
    assert logits.stride(1) == 1, "ban_repeated_ngrams_kernel: rows must be contiguous"
    banned = torch.empty(rows, width, dtype=torch.int32, device=logits.device)
    original = torch.empty(rows, width, dtype=logits.dtype, device=logits.device)
    _no_repeat_ngram_kernel[(rows,)](
        logits, logits.stride(0), vocab,
        ctx.expanded_idx_mapping, ctx.pos, ctx.expanded_local_pos, ctx.input_ids, rows - 1,
        all_token_ids, all_token_ids.stride(0), all_token_ids.shape[1], prompt_len,
        n, window, whitelist, whitelist.stride(0), whitelist.shape[1],
        banned, original, width,
        spared if spared is not None else ctx.expanded_idx_mapping, spared is not None,
        BLOCK=min(HISTORY_BLOCK, triton.next_power_of_2(width)),
        VOCAB_BLOCK=min(VOCAB_BLOCK, triton.next_power_of_2(vocab)),
    )  # fmt: skip
    return logits
