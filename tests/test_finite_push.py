"""A penalty is a finite push: repetition / frequency / presence and DRY move a logit no
further than ``PENALTY_LIMIT_LOGIT`` (a logit already past it stays), so no penalty leaves a
row, or the tokens a grammar allows, with no finite logit, even divided by a temperature of
1e-5. Below the limit every result is vLLM's / llama.cpp's, bit for bit (their tests)."""

from __future__ import annotations

import torch

from constrained.processors.dry_math import dry_penalize
from constrained.processors.functional import (
    PENALTY_LIMIT_LOGIT,
    apply_penalties,
    apply_sparse_penalties,
)

INF = float("inf")
LIMIT = torch.tensor(PENALTY_LIMIT_LOGIT).item()  # as float32 holds it


def penalize(logits: list[float], repetition: float, frequency: float = 0.0) -> torch.Tensor:
    row = torch.tensor([logits])
    counts = torch.ones_like(row, dtype=torch.int64)
    return apply_penalties(
        row, counts, torch.zeros_like(counts), torch.tensor([repetition]),
        torch.tensor([frequency]), torch.tensor([0.0]),
    )[0]  # fmt: skip


def test_a_repetition_penalty_past_float32_is_held_at_the_limit() -> None:
    out = penalize([-5.0, 5.0, -INF, 0.0], 1e38)  # vLLM's arithmetic: -5 * 1e38 = -inf
    assert out[0].item() == -LIMIT and out[2].item() == -INF
    assert 0 < out[1].item() < 1e-37 and out[3].item() == 0.0
    assert torch.isfinite(out[0] / 1e-5)  # the smallest temperature vLLM samples with
    up = penalize([5.0, -5.0], 1e-38, frequency=-2.0)
    assert up[0].item() == LIMIT  # 5 / 1e-38 would be +inf
    assert torch.isfinite(up).all()


def test_a_logit_already_past_the_limit_is_left_where_it_is() -> None:
    out = penalize([-INF, -3e30], 2.0)  # pushed down: no lower
    assert out[0].item() == -INF  # masked before (vLLM's allowed_token_ids): never raised
    assert out[1].item() == torch.tensor(-3e30).item()
    up = penalize([3e30], 0.5)  # pushed up: no higher
    assert up[0].item() == torch.tensor(3e30).item()


def test_sparse_rows_hold_the_same_limit() -> None:
    logits = torch.tensor([[1.0, -2.0, 3.0, -4.0]])
    ids = torch.tensor([[1, 3]])
    counts = torch.ones(1, 2, dtype=torch.int64)
    apply_sparse_penalties(
        logits, ids, counts, torch.zeros_like(counts), torch.tensor([1e38]),
        torch.tensor([0.0]), torch.tensor([0.0]),
    )  # fmt: skip
    assert logits[0].tolist() == [1.0, -LIMIT, 3.0, -LIMIT]


def test_dry_past_float32_is_held_at_the_limit() -> None:
    # history 5 6 5 -> 6 would extend the repeat "5": penalized by 1e38 * 3 ** 0 ... and more
    logits = torch.tensor([[0.0, 1.0, -INF, 2.0, 0.5, 0.25, 4.0]])
    history = torch.tensor([[5, 6, 5, 6, 5]])
    lengths = torch.tensor([[1, 2, 3, 4, 0]])
    out = dry_penalize(
        logits.clone(), history, lengths, torch.zeros(1, 5, dtype=torch.bool),
        torch.tensor([1]), torch.tensor([1e38]), torch.tensor([3.0]), torch.tensor([0]),
    )[0]  # fmt: skip
    assert out[6].item() == -LIMIT  # 4 - inf, held
    assert out[5].item() == -LIMIT
    assert out[2].item() == -INF and out[:2].tolist() == [0.0, 1.0]
