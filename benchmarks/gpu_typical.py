"""Typical-p's Triton kernel on a GPU: where its time goes, pass by pass, and what its launch
settings change (docs/benchmarks.md: 8.9 ms at 248,320 x 256 on an H200, target 2 ms).

For each point (vocab x batch, ``torch.randn`` logits as the kit's bench, ``typical_p`` 0.9) and
each setting in ``SETTINGS`` (the defaults, then one knob at a time): the median ms of
``typical_bounds_kernel`` (CUDA events, ``--repeats`` calls after two warm-ups), the median ms
of each of its 7 launches, and whether its bounds are bit for bit the defaults'.

Runs in ``benchmarks/gpu_check.py``'s child process (the kit's site on the path)::

    python3 -m benchmarks.gpu_check --out $OUT/gc --skip a,b,c,d
    python3 -m benchmarks.gpu_typical --json /tmp/typical.json   (any torch with CUDA + Triton)
    python -m benchmarks.gpu_typical --json typical.json --plot typical.png   (the plot, anywhere)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

# On an H200 (2026-12-04, benchmarks/results/gpu/h200_1204b/run1): the defaults were the
# fastest of the settings that keep the bounds bit for bit; CHUNK 16384 was 0.89x-0.93x but
# sums in another order (bounds move by a rounding). Summing each block's one-hot histogram
# at once (80 registers instead of 168) was 2.5x-2.9x slower and is gone.
SETTINGS: dict[str, dict] = {
    "defaults": {},  # HIST_BLOCK 256, CHUNK 8192, 8 warps: 168 registers, one block per SM
    "hist_block_128": {"HIST_BLOCK": 128},
    "warps_4": {"num_warps": 4},
    "chunk_4096": {"CHUNK": 4096},
    "chunk_16384": {"CHUNK": 16384},
}


class Timed:
    """``_typical_pass_kernel`` with a CUDA event pair around each launch."""

    def __init__(self, kernel, marks: list) -> None:
        self.kernel, self.marks = kernel, marks

    def __getitem__(self, grid: tuple):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            launch(*args, **kwargs)
            end.record()
            self.marks.append((start, end))

        return run


def measure(logits, mass, tuning: dict, repeats: int) -> dict:
    from constrained.processors import truncation_kernels as tk

    for _ in range(2):  # compile, warm
        tk.typical_bounds_kernel(logits, mass, tuning)
    torch.cuda.synchronize()
    whole = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        low, high = tk.typical_bounds_kernel(logits, mass, tuning)
        end.record()
        end.synchronize()
        whole.append(start.elapsed_time(end))
    kernel, marks, passes = tk._typical_pass_kernel, [], []
    tk._typical_pass_kernel = Timed(kernel, marks)
    try:
        for _ in range(repeats):
            marks.clear()
            tk.typical_bounds_kernel(logits, mass, tuning)
            torch.cuda.synchronize()
            passes.append([s.elapsed_time(e) for s, e in marks])
    finally:
        tk._typical_pass_kernel = kernel
    per_pass = [round(statistics.median(col), 4) for col in zip(*passes, strict=True)]
    return {"median_ms": round(statistics.median(whole), 4), "pass_ms": per_pass,
            "bits": (low.view(torch.int32).tolist(), high.view(torch.int32).tolist())}  # fmt: skip


def plot(record: dict, path: str) -> None:
    """One panel per point: each setting's ms per call, stacked by launch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = record["points"]
    fig, axes = plt.subplots(1, len(points), figsize=(4.6 * len(points), 4.2))
    axes = axes if len(points) > 1 else [axes]
    labels = ["top, bottom", "Z, moment", "paths 1", "paths 2", "paths 3", "paths 4", "bounds"]
    for ax, (point, rows) in zip(axes, points.items(), strict=True):
        names = [n for n, r in rows.items() if "pass_ms" in r]
        bottom = [0.0] * len(names)
        for k, label in enumerate(labels):
            values = [rows[n]["pass_ms"][k] for n in names]
            ax.bar(names, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_title(f"{point} (vocab x batch)")
        ax.tick_params(axis="x", labelrotation=70, labelsize=7)
    axes[0].set_ylabel("ms per call (launches timed one by one)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"typical-p's bounds kernel, {record['device']}, typical_p {record['mass']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--plot", default="", help="only draw this PNG from --json (no GPU)")
    p.add_argument("--points", default="248320x256,151936x256,248320x64,151936x64")
    p.add_argument("--only", default=",".join(SETTINGS))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--mass", type=float, default=0.9)
    a = p.parse_args(argv)
    if a.plot:
        with open(a.json) as f:
            plot(json.load(f), a.plot)
        return 0
    out: dict = {"device": torch.cuda.get_device_name(), "mass": a.mass, "points": {}}
    t0 = time.monotonic()
    for point in a.points.split(","):
        vocab, batch = (int(x) for x in point.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(batch, vocab, generator=gen, device="cuda")
        mass = torch.full((batch,), a.mass, device="cuda")
        rows, reference = {}, None
        for name in a.only.split(","):
            try:
                r = measure(logits, mass, SETTINGS[name], a.repeats)
            except Exception as exc:  # a setting that does not compile: say so, go on
                rows[name] = {"error": repr(exc)[:300]}
                print(f"{point} {name}: {exc!r}"[:300], flush=True)
                continue
            bits = r.pop("bits")
            reference = bits if reference is None else reference
            r["same_bounds"] = bits == reference
            pairs = zip(bits[0] + bits[1], reference[0] + reference[1], strict=True)
            r["rows_differ"] = sum(x != y for x, y in pairs)
            rows[name] = r
            took = time.monotonic() - t0
            print(f"{point} {name:22s} {r['median_ms']:8.3f} ms  passes {r['pass_ms']}  "
                  f"same={r['same_bounds']} ({took:.0f}s)", flush=True)  # fmt: skip
        out["points"][point] = rows
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
