"""Pure tensor functions behind the processors: no vLLM, no state, batched over rows.

Every function edits ``logits`` ([rows, vocab], float32) in place and returns it. Per-row
parameters come as tensors already gathered for those rows, so the same function serves
Model Runner V1 (row = batch index) and V2 (row = logits row, mapped from a request slot).
"""

from __future__ import annotations

import torch

# Padding for unused bias slots: x + (-0.0) == x for every float x, -0.0 and inf included,
# so padded entries leave logits bit-for-bit unchanged.
NEUTRAL_BIAS = -0.0


def apply_logit_bias(
    logits: torch.Tensor, token_ids: torch.Tensor, biases: torch.Tensor
) -> torch.Tensor:
    """Add per-row sparse biases: ``logits[r, token_ids[r, k]] += biases[r, k]``.

    Args:
        logits: [rows, vocab] float32.
        token_ids: [rows, K] int64; unused entries point anywhere with bias ``NEUTRAL_BIAS``.
        biases: [rows, K] float32.

    Example::

        >>> logits = torch.zeros(1, 4)
        >>> apply_logit_bias(logits, torch.tensor([[2, 0]]), torch.tensor([[5.0, -0.0]]))
        tensor([[0., 0., 5., 0.]])
    """
    return logits.scatter_add_(1, token_ids, biases)


def apply_min_p(logits: torch.Tensor, log_min_p: torch.Tensor) -> torch.Tensor:
    """Min-p filtering: drop tokens whose probability is below ``min_p`` times the top one.

    ``p_i < min_p * p_max`` with ``p = softmax(l / T)`` is, taking logs,
    ``l_i < l_max + T * log(min_p)``, so no softmax is needed: one max and one compare.

    Args:
        logits: [rows, vocab] float32 (raw, or already divided by temperature).
        log_min_p: [rows] float32, ``T * log(min_p)`` (``T = 1`` for logits already divided
            by temperature); ``-inf`` leaves the row untouched (min_p off, or greedy).

    Example::

        >>> logits = torch.tensor([[0.0, -1.0, -3.0]])
        >>> apply_min_p(logits, torch.log(torch.tensor([0.2])))  # exp(-3) < 0.2 <= exp(-1)
        tensor([[ 0., -1., -inf]])
    """
    threshold = logits.amax(dim=-1, keepdim=True).add_(log_min_p.unsqueeze(1))
    return logits.masked_fill_(logits < threshold, float("-inf"))
