"""Compile every variant of our Triton kernels for an H100/H200 (sm_90), without a GPU.

``python -m tests.v2_real.cuda_compile VARIANTS.json``: the variants are those
``tests/v2_real/launch_counts.py --variants`` saw launched in Triton's interpreter (argument
types and constexpr values of each launch). The interpreter runs the kernels as Python and
forgives what Triton's compiler refuses (a name bound under one branch only; an ``int64`` and
an ``int32`` out of two branches): both reached an H200 once and failed there (#28). Here each
variant goes through Triton's own NVIDIA backend down to a cubin (its bundled ``ptxas``). Run
in a fresh process, never beside the harness: the interpreter patches ``triton.language``.
The penalty kernel's PTX is also checked to round ``l * (1 / r)`` on its own, as vLLM's
kernel does (``repetition_factor_in_fma``): an FMA there made our rows 1 ulp off vLLM's on an
H200. Prints ``CUDACOMPILE`` and the JSON ``{variant: "ok" | error}``.
"""

from __future__ import annotations

import importlib
import json
import re
import sys

from triton.backends import backends

# vLLM's CPU build enables Triton only where it has a "cpu" backend: alias it for the import,
# then drop the alias so that the "cuda" target has exactly one backend.
backends.setdefault("cpu", backends["nvidia"])

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def repetition_factor_in_fma(ptx: str) -> bool:
    """Whether the repetition penalty's factor (``1 / r``, a ``div.full.f32``, or ``r``
    chosen by ``selp``) enters an FMA: then the compiler fused ``l * factor`` with the
    frequency term and the row is 1 ulp off vLLM's own kernel on CUDA, which rounds the
    product on its own and fuses only ``- f * count`` (seen on an H200 in #28)."""
    factor: set[str] = set()
    for line in ptx.splitlines():
        m = re.match(r"\s*([\w.]+)\s+(%\w+),\s*(.*);", line)
        if not m:
            continue
        op, dst, rest = m.groups()
        sources = re.findall(r"%\w+", rest)
        chosen = op.startswith(("selp.f32", "mov.b32", "mov.f32")) and factor & set(sources)
        if op.startswith("div.full.f32") or chosen:
            factor.add(dst)
        elif op.startswith("fma.rn.f32") and factor & set(sources):
            return True
    return False


def compile_all(variants: list[dict]) -> dict[str, str]:
    kernels = [getattr(importlib.import_module(v["module"]), v["name"]) for v in variants]
    backends.pop("cpu", None)
    results = {}
    for variant, kernel in zip(variants, kernels, strict=True):
        label = f"{variant['name']} {variant['constexprs']} warps={variant['num_warps']}"
        try:
            source = ASTSource(kernel, variant["signature"], constexprs=variant["constexprs"])
            compiled = triton.compile(
                source, target=TARGET, options={"num_warps": variant["num_warps"]}
            )
            results[label] = "ok"
            penalties = variant["name"] == "_penalties_max_kernel"
            penalties = penalties and variant["constexprs"].get("HAS_PENALTIES")
            if penalties and repetition_factor_in_fma(compiled.asm["ptx"]):
                results[label] = "the repetition factor is fused into an FMA (1 ulp off vLLM)"
        except Exception as exc:  # a compile error is the finding: report it, go on
            results[label] = f"{type(exc).__name__}: {str(exc)[-800:]}"
    return results


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        variants = json.load(f)
    results = compile_all(variants)
    for label, status in results.items():
        print(f"sm_90 {'ok' if status == 'ok' else 'FAILED'}: {label}", flush=True)
    print("CUDACOMPILE " + json.dumps(results))
    return 0 if all(s == "ok" for s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
