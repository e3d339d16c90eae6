"""Typical-p's Triton kernel (``processors/truncation_kernels.py``) on full-vocabulary rows, in
Triton's interpreter: prints ``TYPICALROWS`` and the JSON of each row's ``(low, high)``, and
how many rows' bounds differ from the six-level search's (``typical_levels_reference.py``).

Run in a fresh process (``python -m tests.v2_real.typical_kernel_rows``): it imports the V2
harness first, which makes Triton interpret on CPU. The rows are
``tests/test_truncation_samplers.typical_rows``; the test there checks the bounds against
the float64 sorting reference. The comparison with the level search runs on those rows and
on ``shaped_rows``: ties (bfloat16 and float16 grids, a few values), peaked and flat rows,
a spread past float32's ``exp`` range, mostly masked rows, widths of 2 to three chunks.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import json
import math

import torch

from constrained.processors.truncation_kernels import typical_bounds_kernel
from tests.test_truncation_samplers import TYPICAL_MASSES, typical_rows
from tests.v2_real.typical_levels_reference import typical_levels_bounds

MASSES = [0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 0.9999]


def shaped_rows() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Blocks of two rows, one shape each, with masses from ``MASSES``."""
    gen = torch.Generator().manual_seed(57)
    widths = [50_000, 2, 17, 4096, 12_000, 33_000, 9_000, 40_000, 1_000, 8_000, 10_000]
    blocks = []
    for kind, vocab in enumerate(widths):
        x = torch.randn(2, vocab, generator=gen)
        if kind == 0:  # a model's bfloat16 logits: ties everywhere
            x = (x * 3).bfloat16().float()
            x[:, :50] += torch.linspace(8, 2, 50)
        elif kind == 3:  # a few values only
            x = torch.randint(0, 7, (2, vocab), generator=gen).float() * 0.5
        elif kind == 4:  # peaked
            x = x * 0.1
            x[:, 0] += 20.0
        elif kind == 5:  # a spread past exp's range: the underflow clamp
            x = x * 60
        elif kind == 6:  # nearly flat: the range's 1e-3 floor
            x = x * 1e-6
        elif kind == 7:  # mostly masked
            keep = torch.rand(2, vocab, generator=gen) < 0.01
            x = torch.where(keep, x * 3, torch.tensor(-math.inf))
            x[:, 0] = 1.0
        elif kind == 8:  # a float16 grid far from 0
            x = (x * 5 + 1000).half().float()
        elif kind == 9:  # two clusters
            x = torch.where(torch.rand(2, vocab, generator=gen) < 0.5, x * 0.01, x * 0.01 - 30)
        elif kind == 10:  # integers
            x = (x * 4).round()
        picks = torch.randint(0, len(MASSES), (2,), generator=gen).tolist()
        blocks.append((x.contiguous(), torch.tensor([MASSES[i] for i in picks])))
    return blocks


def main() -> None:
    assert harness.INTERPRETED
    logits, masses = typical_rows(), torch.tensor(TYPICAL_MASSES)
    low, high = typical_bounds_kernel(logits, masses)
    compared, differ = 0, []
    for i, (rows, mass) in enumerate([(logits, masses), *shaped_rows()]):
        ours = typical_bounds_kernel(rows, mass) if i else (low, high)
        theirs = typical_levels_bounds(rows, mass)
        for r in range(rows.shape[0]):
            got = [ours[0][r].view(torch.int32).item(), ours[1][r].view(torch.int32).item()]
            want = [theirs[0][r].view(torch.int32).item(), theirs[1][r].view(torch.int32).item()]
            if got != want:
                differ.append({"block": i, "row": r, "got": got, "want": want})
        compared += rows.shape[0]
    result = {"low": low.tolist(), "high": high.tolist(), "compared": compared, "differ": differ}
    print("TYPICALROWS " + json.dumps(result))


if __name__ == "__main__":
    main()
