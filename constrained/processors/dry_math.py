"""The math of DRY ("don't repeat yourself", llama.cpp's ``llama_sampler_dry``): pure tensors.

Each row comes as its recent tokens (prompt and output), right-aligned in a ``[rows, width]``
history (``-1`` where there is none); the newest token is last. For every earlier position
``w``, ``L[w]`` is the length of the longest common suffix of the history up to ``w`` and the
whole history (the "Z-algorithm" repeat counts of llama.cpp's step 2); the token after ``w``
would extend that repeat, so it is penalized by ``multiplier * base ** (L - allowed_length)``
when ``L >= allowed_length``. Sequence breakers cap ``L`` at the number of tokens since the
most recent breaker, and a breaker token itself is never penalized.
"""

from __future__ import annotations

import numpy as np
import torch

from constrained.processors.functional import PENALTY_LIMIT_LOGIT

# llama.cpp: log(FLT_MAX), the largest exponent base ** e may reach before float overflow.
FLOAT_MAX_LOG = 88.7228391


def max_exponent(base: float) -> int:
    """llama.cpp's clamp of ``L - allowed_length`` (0: no clamp, for bases <= 1.000001), in
    its float32 arithmetic (``FLOAT_MAX_LOG / std::log(dry_base)``, truncated)."""
    base32 = np.float32(base)
    if not base32 > np.float32(1.000001):
        return 0
    return int(np.float32(FLOAT_MAX_LOG) / np.log(base32))


def repeat_lengths(
    history: torch.Tensor,
    breaker: torch.Tensor,
    cap: torch.Tensor,
    max_len: int,
    stop_early: bool = False,
) -> torch.Tensor:
    """``L[r, w]``: how many tokens ending at ``w`` equal the row's newest tokens, capped.

    ``L[r, w] = min(k, rep_limit[r], cap[r])`` with ``k`` the longest ``k`` such that
    ``history[r, w - j] == history[r, -1 - j]`` for ``j < k`` (only real tokens match), and
    ``rep_limit`` the number of tokens after the row's most recent breaker (its whole history
    when it has none). Positions ``w`` range over all but the newest.

    Args:
        history: [rows, width] int64, right-aligned, ``-1`` where there is no token.
        breaker: [rows, width] bool, the history's single-token sequence breakers.
        cap: [rows] int64: a row's lengths never matter beyond it (``allowed_length`` plus
            llama.cpp's exponent clamp); 0 turns the row off.
        max_len: a host bound of the loop (``max(cap)``, at most ``width - 1``).
        stop_early: end the loop once no repeat is still growing (reads a device value:
            only where that is free, i.e. on CPU).

    Returns:
        [rows, width] int64, 0 at the newest position.

    Example::

        >>> h = torch.tensor([[1, 2, 3, 3, 2, 3, 9, 1, 2, 3]])  # llama.cpp's "a b c c b c y a b c"
        >>> repeat_lengths(h, torch.zeros_like(h, dtype=torch.bool), torch.tensor([9]), 9)
        tensor([[0, 0, 3, 1, 0, 2, 0, 0, 0, 0]])
    """
    width = history.shape[1]
    positions = torch.arange(width, device=history.device)
    last_breaker = torch.where(breaker, positions, -1).amax(-1)  # -1: none
    real = (history >= 0).sum(-1)
    since = torch.where(last_breaker >= 0, width - 1 - last_breaker, real)
    limit = torch.minimum(since, cap).unsqueeze(1)
    lengths = torch.zeros_like(history)
    run = torch.ones_like(history, dtype=torch.bool)
    run[:, -1] = False  # the newest position is the suffix itself
    for k in range(min(max_len, width - 1)):
        newest = history[:, width - 1 - k].unsqueeze(1)  # the k-th newest token
        earlier = torch.full_like(history, -1)
        earlier[:, k:] = history[:, : width - k]  # earlier[r, w] = history[r, w - k]
        run &= (earlier == newest) & (newest >= 0)
        lengths += run & (k < limit)
        if stop_early and not bool(run.any()):
            break
    return lengths


def dry_penalize(
    logits: torch.Tensor,
    history: torch.Tensor,
    lengths: torch.Tensor,
    breaker_token: torch.Tensor,
    allowed: torch.Tensor,
    multiplier: torch.Tensor,
    base: torch.Tensor,
    exponent_cap: torch.Tensor,
) -> torch.Tensor:
    """Subtract DRY's penalty from the token after each repeat (in place, no host reads).

    The token ``t = history[r, w + 1]`` would extend the repeat of ``n = lengths[r, w]``
    tokens; each ``t`` takes its largest ``n``, and if ``n >= allowed``,
    ``l[t] -= multiplier * base ** min(n - allowed, exponent_cap)`` (``exponent_cap`` 0: no
    clamp), the penalty computed in float64 and applied in float32, as llama.cpp does, down to
    ``-PENALTY_LIMIT_LOGIT`` at most (a finite push: llama.cpp's clamp still lets the penalty
    reach ``FLT_MAX``, which a temperature below 1 turns into ``-inf``). Tokens that are
    single-token breakers are never penalized.

    Args:
        logits: [rows, vocab] float32.
        history, lengths: [rows, width] from ``repeat_lengths``.
        breaker_token: [rows, width] bool: ``history[r, w]`` is a breaker.
        allowed, exponent_cap: [rows] int64; multiplier, base: [rows] float32.
    """
    rows, vocab = logits.shape
    following = history[:, 1:]
    n = lengths[:, :-1]
    hit = (n >= allowed.unsqueeze(1)) & (following >= 0) & ~breaker_token[:, 1:]
    exponent = n - allowed.unsqueeze(1)
    capped = exponent_cap.unsqueeze(1)
    exponent = torch.where((capped > 0) & (exponent > capped), capped, exponent)
    scale = multiplier.double().unsqueeze(1)  # float32 values, float64 product: llama.cpp's
    penalty = (scale * base.double().unsqueeze(1) ** exponent.double()).float()
    flat = logits.view(-1)
    index = torch.arange(rows, device=logits.device).unsqueeze(1) * vocab + following.clamp(min=0)
    current = flat[index]
    # Duplicate targets take the smallest result: the largest penalty (it grows with n).
    floor = current.clamp(max=-PENALTY_LIMIT_LOGIT)  # a logit already below stays there
    src = torch.where(hit, torch.maximum(current - penalty, floor), torch.inf)
    flat.scatter_reduce_(0, index.flatten(), src.flatten(), reduce="amin")
    return logits
