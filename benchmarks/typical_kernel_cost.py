"""Typical-p's Triton kernel next to the six-level search it replaced (#57), without a GPU.

Two measurements, each in a fresh process (``--mode``):

- ``interpreter``: both kernels on ``tests/test_truncation_samplers.typical_rows`` (10 rows of
  151,936 logits) in Triton's CPU interpreter, the way the V2 tests run them: launches,
  launches reading the logits, wall seconds per call (median of ``--repeats``) and whether
  the bounds agree bit for bit. Interpreter seconds count interpreted block ops, not GPU time.
- ``sass``: each pass compiled for sm_90 (vocab 151,936, the GPU's block sizes) with Triton's
  bundled tools: registers per thread, local memory (spills), and the instructions of the
  pass's loop body, with the logits it covers per thread and iteration. A static count, not a
  timing: a GPU run (``benchmarks/gpu_check.py``) is what times the step.

Usage::

    python -m benchmarks.typical_kernel_cost --mode interpreter --repeats 3
    python -m benchmarks.typical_kernel_cost --mode sass
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 151_936
ARGS = ["logits_ptr", "logits_stride", "vocab", "mass_ptr", "stats_ptr", "totals_ptr",
        "hist_ptr", "below_ptr", "low_ptr", "high_ptr"]  # fmt: skip
TYPES = ["*fp32", "i32", "i32", "*fp32", "*fp32", "*fp64", "*fp64", "*fp64", "*fp32", "*fp32"]


def interpreter(repeats: int) -> dict:
    from tests.v2_real import harness  # first: Triton interprets

    assert harness.INTERPRETED
    import torch

    from constrained.processors import truncation_kernels as new
    from tests.test_truncation_samplers import TYPICAL_MASSES, typical_rows
    from tests.v2_real import typical_levels_reference as old

    logits, mass = typical_rows(), torch.tensor(TYPICAL_MASSES)
    out = {}
    for name, module, bounds in (("levels (before #57)", old, old.typical_levels_bounds),
                                 ("paths (#57)", new, new.typical_bounds_kernel)):  # fmt: skip
        kernel = next(v for k, v in vars(module).items() if k.endswith("_pass_kernel"))
        launches: list[tuple] = []
        setattr(module, kernel.__name__, Counted(kernel, launches))
        try:
            times, result = [], None
            for _ in range(repeats):
                launches.clear()
                start = time.perf_counter()
                result = bounds(logits, mass)
                times.append(time.perf_counter() - start)
        finally:
            setattr(module, kernel.__name__, kernel)
        out[name] = {
            "launches": len(launches),
            "reading_the_logits": sum(grid[1] > 1 for grid in launches),
            "seconds": round(statistics.median(times), 2),
            "bits": [result[0].view(torch.int32).tolist(), result[1].view(torch.int32).tolist()],
        }
    first, second = out.values()
    same = first.pop("bits") == second.pop("bits")
    return {"rows": list(logits.shape), "same_bounds": same, **out}


class Counted:
    """A Triton kernel that records each launch's grid."""

    def __init__(self, kernel, launches: list[tuple]) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: tuple):
        self.launches.append(grid)
        return self.kernel[grid]


def sass() -> dict:
    from triton.backends import backends

    backends.setdefault("cpu", backends["nvidia"])  # vLLM's CPU build wants one, for import
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from constrained.processors import truncation_kernels as new
    from constrained.processors.truncation_math import FLOAT32_UNDERFLOW, TYPICAL_MARGIN
    from tests.v2_real import typical_levels_reference as old

    backends.pop("cpu", None)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    split = triton.next_power_of_2(triton.cdiv(VOCAB, 8192))
    common = {"MARGIN": TYPICAL_MARGIN, "UNDERFLOW": FLOAT32_UNDERFLOW, "SPLIT_P2": split,
              "BLOCK": 1024, "CHUNK": 8192}  # fmt: skip
    kinds = {
        "levels (before #57)": (old._levels_pass_kernel, {"BINS": 16, "LEVELS": 6}, 9, 1024),
        "paths (#57)": (new._typical_pass_kernel, {
            "BINS": 64, "BITS": 6, "PASSES": 4, "DIGIT_BINS": 16, "DIGIT_BITS": 4, "LEVELS": 6,
            "HIST_BLOCK": 256}, 7, 256),
    }  # fmt: skip
    out = {}
    for name, (kernel, extra, passes, hist_block) in kinds.items():
        rows = []
        for p in range(passes):
            constexprs = {"PASS": p, **common, **extra}
            signature = dict(zip(ARGS, TYPES, strict=True)) | dict.fromkeys(constexprs, "constexpr")
            source = ASTSource(kernel, signature, constexprs=constexprs)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 8})  # fmt: skip
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                dump = [str(tools / "cuobjdump"), f.name]
                usage = subprocess.run([*dump[:1], "-res-usage", f.name], capture_output=True,
                                       text=True, check=True).stdout  # fmt: skip
                code = subprocess.run([dump[0], "-sass", f.name], capture_output=True,
                                      text=True, check=True).stdout  # fmt: skip
            regs = re.search(r"REG:(\d+)", usage)
            local = re.search(r"LOCAL:(\d+)", usage)
            body = loop_bodies(code)
            per_iter = hist_block if 2 <= p < passes - 1 else 1024
            rows.append({"pass": p, "registers": int(regs.group(1)) if regs else None,
                         "local_bytes": int(local.group(1)) if local else None,
                         "loop_instructions": body, "logits_per_thread_and_iteration":
                         per_iter / 256 if body else None})  # fmt: skip
        out[name] = rows
    return out


def loop_bodies(code: str) -> list[int]:
    """Instructions between each backward branch and its target, in a SASS listing."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             re.finditer(r"/\*([0-9a-f]{4,5})\*/\s+([^;]*);", code)]  # fmt: skip
    bodies = []
    for addr, text in lines:
        target = re.search(r"BRA\s+`?\(?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            bodies.append(sum(int(target.group(1), 16) <= a <= addr for a, _ in lines))
    return bodies


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["interpreter", "sass"], required=True)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    result = interpreter(args.repeats) if args.mode == "interpreter" else sass()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
