"""``apply_token_bitmask`` equals the plain-torch reference, on sparse, dense and half-set
masks (each takes its own path on CPU: kept logits put back, the kernel alone, empty words
first)."""

from __future__ import annotations

import pytest
import torch

from constrained.processors.functional import apply_token_bitmask, apply_token_bitmask_torch

WIDTH = 151_936
WORDS = WIDTH // 32


def bitmask(kind: str, rows: int, generator: torch.Generator) -> torch.Tensor:
    """Sparse: a few allowed tokens per row (JSON structure); dense: most allowed (strings);
    half: the first half of the words all-allowed, the rest as sparse."""
    count, fill = (300, -1) if kind == "dense" else (5, 0)
    mask = torch.full((rows, WORDS), fill, dtype=torch.int32)
    cols = torch.randint(0, WORDS, (rows, count), generator=generator)
    bits = torch.randint(-(2**31), 2**31 - 1, (rows, count), generator=generator)
    mask.scatter_(1, cols, bits.to(torch.int32))
    if kind == "half":
        mask[:, : WORDS // 2] = -1
    if kind == "none":  # nothing allowed (every word zero)
        mask.zero_()
    return mask


@pytest.mark.parametrize("kind", ["sparse", "dense", "half", "none", "mixed"])
@pytest.mark.parametrize("rows", [[0, 3, 4, 8, 9], [3], [9, 3, 3, 0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_torch_reference_on_a_subset_of_rows(kind, rows, dtype):
    gen = torch.Generator().manual_seed(7)
    if kind == "mixed":
        mask = torch.cat([bitmask("sparse", 3, gen), bitmask("dense", 3, gen)])
        mask = torch.cat([mask, bitmask("half", 3, gen), bitmask("none", 1, gen)])
    else:
        mask = bitmask(kind, 10, gen)
    if kind != "none":
        mask[3, :4] = -1  # allows tokens that were masked earlier (below): they stay masked
    logits = torch.randn(10, WIDTH, generator=gen).to(dtype)
    logits[3, :100] = float("-inf")  # masked earlier: must stay masked
    expected = logits.clone()
    apply_token_bitmask_torch(expected, mask, rows)
    apply_token_bitmask(logits, mask, rows)
    assert torch.equal(logits, expected)
    untouched = [r for r in range(10) if r not in rows]
    assert torch.isfinite(logits[untouched]).all()
