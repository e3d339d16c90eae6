"""Typical-p's Triton kernel (``processors/truncation_kernels.py``) on full-vocabulary rows, in
Triton's interpreter: prints ``TYPICALROWS`` and the JSON of each row's ``(low, high)``.

Run in a fresh process (``python -m tests.v2_real.typical_kernel_rows``): it imports the V2
harness first, which makes Triton interpret on CPU. The rows are
``tests/test_truncation_samplers.typical_rows``; the test there checks the bounds against
the float64 sorting reference.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import json

import torch

from constrained.processors.truncation_kernels import typical_bounds_kernel
from tests.test_truncation_samplers import TYPICAL_MASSES, typical_rows


def main() -> None:
    assert harness.INTERPRETED
    low, high = typical_bounds_kernel(typical_rows(), torch.tensor(TYPICAL_MASSES))
    print("TYPICALROWS " + json.dumps({"low": low.tolist(), "high": high.tolist()}))


if __name__ == "__main__":
    main()
