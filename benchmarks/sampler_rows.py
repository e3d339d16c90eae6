"""What a grammar row costs the worker past the fill, by its kind (#55): the mask applied to
the logits (vLLM's own path: xgrammar's CPU kernel; ours: ``functional.apply_token_bitmask``)
and vLLM's CPU sampler (``fused_gumbel_argmax``, which skips ``-inf`` logits), for a batch of
rows that allow free text (every token) or structure (96 tokens).

This is why ``server_profile`` finds vLLM's time in its mask kernel and ours in the sampler on
``tool_calls_cold --shapes required``: vLLM's outputs ramble in whitespace (rows of structure),
ours write strings that closing ends in time (rows of text).

    python -m benchmarks.sampler_rows --out benchmarks/results/sampler_rows

Writes ``sampler_rows.json`` and ``sampler_rows.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ALLOWED_IN_STRUCTURE = 96  # tokens a row of JSON structure allows, about (whole words)


def timed(call: Callable[[], object], repeats: int) -> float:
    """Median ms of ``call`` over ``repeats`` runs, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return 1e3 * times[len(times) // 2]


def measure(rows: int, width: int, repeats: int) -> dict[str, dict[str, float]]:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vLLM's CPU ops)

    words = (width + 31) // 32
    masks = {
        "text": torch.full((rows, words), -1, dtype=torch.int32),
        "structure": torch.zeros((rows, words), dtype=torch.int32),
    }
    masks["structure"][:, : ALLOWED_IN_STRUCTURE // 32] = -1
    seeds = torch.randint(0, 2**31, (rows,), dtype=torch.long)
    return {kind: row_costs(mask, seeds, width, repeats) for kind, mask in masks.items()}


def row_costs(mask: torch.Tensor, seeds: torch.Tensor, width: int, repeats: int) -> dict:
    """One kind of row's costs, ms for the batch (each mask timing includes a ``clone``)."""
    import torch
    import xgrammar

    from constrained.processors.functional import apply_token_bitmask

    rows = list(range(mask.shape[0]))
    logits = torch.randn(mask.shape[0], width)
    masked = logits.clone()
    apply_token_bitmask(masked, mask, rows)
    return {
        "vllm_mask_ms": timed(
            lambda: xgrammar.apply_token_bitmask_inplace(logits.clone(), mask), repeats
        ),
        "ours_mask_ms": timed(lambda: apply_token_bitmask(logits.clone(), mask, rows), repeats),
        "clone_ms": timed(logits.clone, repeats),
        "sampler_ms": timed(lambda: torch.ops._C.fused_gumbel_argmax(masked, seeds), repeats),
    }


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = record["result"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    labels, vllm_side, ours_side = [], [], []
    for kind, row in result.items():
        labels.append(kind)
        vllm_side.append(row["vllm_mask_ms"] - row["clone_ms"] + row["sampler_ms"])
        ours_side.append(row["ours_mask_ms"] - row["clone_ms"] + row["sampler_ms"])
    ax.barh([i + 0.4 for i in range(len(labels))], vllm_side, 0.4, color="#e76f51",
            label="vLLM's mask + sampler")  # fmt: skip
    ax.barh(range(len(labels)), ours_side, 0.4, color="#264653", label="ours + sampler")
    ax.set_yticks([i + 0.2 for i in range(len(labels))], [f"rows of {k}" for k in labels])
    ax.set_xlabel(f"ms a step, {record['rows']} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--width", type=int, default=151936, help="the tiny Qwen's vocabulary")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path("benchmarks/results/sampler_rows"))  # fmt: skip
    args = parser.parse_args(argv)
    from benchmarks.common import machine_info

    record = {
        "command": "python -m benchmarks.sampler_rows " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "rows": args.rows,
        "result": measure(args.rows, args.width, args.repeats),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampler_rows.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, args.out / "sampler_rows.png")
    print(json.dumps(record["result"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
