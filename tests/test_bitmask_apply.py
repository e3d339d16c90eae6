"""``apply_token_bitmask`` equals the plain-torch reference, on sparse and dense masks."""

from __future__ import annotations

import pytest
import torch

from constrained.processors.functional import apply_token_bitmask, apply_token_bitmask_torch

WIDTH = 151_936
WORDS = WIDTH // 32


def bitmask(kind: str, rows: int, generator: torch.Generator) -> torch.Tensor:
    """Sparse: a few allowed tokens per row (JSON structure); dense: most allowed (strings)."""
    count, fill = (5, 0) if kind == "sparse" else (300, -1)
    mask = torch.full((rows, WORDS), fill, dtype=torch.int32)
    cols = torch.randint(0, WORDS, (rows, count), generator=generator)
    bits = torch.randint(-(2**31), 2**31 - 1, (rows, count), generator=generator)
    return mask.scatter_(1, cols, bits.to(torch.int32))


@pytest.mark.parametrize("kind", ["sparse", "dense", "mixed"])
def test_matches_the_torch_reference_on_a_subset_of_rows(kind):
    gen = torch.Generator().manual_seed(7)
    if kind == "mixed":
        mask = torch.cat([bitmask("sparse", 5, gen), bitmask("dense", 5, gen)])
    else:
        mask = bitmask(kind, 10, gen)
    logits = torch.randn(10, WIDTH, generator=gen)
    logits[3, :100] = float("-inf")  # masked earlier: must stay masked
    rows = [0, 3, 4, 8, 9]
    expected = logits.clone()
    apply_token_bitmask_torch(expected, mask, rows)
    apply_token_bitmask(logits, mask, rows)
    assert torch.equal(logits, expected)
    untouched = [r for r in range(10) if r not in rows]
    assert torch.isfinite(logits[untouched]).all()
