"""The math of ``no_repeat_ngram_size``: which tokens would repeat an n-gram, and banning them.

Pure tensor functions (no vLLM, no state). Each row comes as its recent output tokens,
right-aligned in a ``[rows, width]`` history (``-1`` where there is no token: before the
window, before the output, or a speculative placeholder); the newest token is last.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
POS_INF = float("inf")


def repeated_ngram_bans(
    history: torch.Tensor, n: torch.Tensor, whitelist: torch.Tensor, max_n: int
) -> torch.Tensor:
    """For each history position ``e``, whether the token there is banned for the next step.

    A token ``t = history[r, e]`` is banned when the ``n - 1`` tokens before it equal the
    row's last ``n - 1`` tokens: emitting ``t`` would repeat the n-gram ending at ``e`` (the
    rule of HF's and vLLM's DeepSeek-OCR ``NoRepeatNGramLogitsProcessor``, over the tokens in
    ``history``). With ``n = 1`` every token in the history is banned. Tokens ``< 0`` never
    match and are never banned, so a row with fewer than ``n`` tokens bans nothing; tokens in
    the row's ``whitelist`` are never banned. Cost: ``max_n - 1`` compares of the history.

    Args:
        history: [rows, width] int64, right-aligned, ``-1`` where there is no token.
        n: [rows] int64 n-gram sizes (``0``: the row bans nothing).
        whitelist: [rows, K] int64 exempt token ids, ``-1`` padded (``K`` may be 0).
        max_n: an upper bound of ``n`` (a host value: the loop's length).

    Returns:
        [rows, width] bool: ``history[r, e]`` is banned.

    Example::

        >>> h = torch.tensor([[5, 6, 7, 5, 6]])  # "5 6" again: 7 would repeat "5 6 7"
        >>> repeated_ngram_bans(h, torch.tensor([3]), torch.empty(1, 0), 3).tolist()
        [[False, False, True, False, False]]
    """
    width = history.shape[1]
    banned = (history >= 0) & (n >= 1).unsqueeze(1)
    before = torch.empty_like(history)
    for m in range(1, min(max_n, width)):
        prefix = history[:, width - m].unsqueeze(1)  # the row's m-th newest token
        before[:, :m] = -1
        before[:, m:] = history[:, :-m]  # before[r, e] = history[r, e - m]
        same = (before == prefix) & (prefix >= 0)
        banned &= same | (n <= m).unsqueeze(1)  # only rows whose n-gram reaches back m
    if max_n > width:  # an n-gram longer than the history: those rows ban nothing
        banned &= (n <= width).unsqueeze(1)
    if whitelist.numel():
        banned &= ~(history.unsqueeze(-1) == whitelist.unsqueeze(1)).any(-1)
    return banned


def ban_tokens(logits: torch.Tensor, history: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """Set ``logits[r, history[r, e]] = -inf`` where ``banned[r, e]``, unless that would leave
    row ``r`` with no finite logit (then the row keeps its banned tokens: a constraint's only
    allowed tokens are never all removed). In place, no host reads.

    Args:
        logits: [rows, vocab] float32.
        history: [rows, width] int64 token ids (``< 0`` entries must not be banned).
        banned: [rows, width] bool.
    """
    rows, vocab = logits.shape
    flat = logits.view(-1)
    index = (
        torch.arange(rows, device=logits.device).unsqueeze(1) * vocab + history.clamp(min=0)
    ).flatten()
    banned = banned.flatten()
    original = flat[index]
    flat.scatter_reduce_(0, index, torch.where(banned, NEG_INF, POS_INF), reduce="amin")
    emptied = (logits.amax(-1) == NEG_INF).repeat_interleave(history.shape[1])
    restore = torch.where(emptied & banned, original, NEG_INF)  # duplicates agree: max
    flat.scatter_reduce_(0, index, restore, reduce="amax")
    return logits
