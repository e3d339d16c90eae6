"""What the installed plugin costs a request that uses none of its options (#29).

Each round starts one engine, ``LLM(model)`` with no flag, in a child process, with our entry
points active (the default) or turned off (``CONSTRAINED_ENTRY_POINTS=0``), and times one
``generate`` of ``--batch`` prompts x ``--tokens`` tokens (temperature 1, a seed per
request, ``ignore_eos``) after a warm-up call. Rounds alternate. Besides throughput, each
round records the CPU seconds the engine's processes (the children of the ``LLM`` process:
engine core and worker) spent in the timed call, which moves less than wall time when other
work shares the machine, and the engine's start-up (``LLM(model)`` until it returns: #55's
"installed but unused adds at most 10 %"). Writes ``plugin_overhead.json`` and ``.png`` (each
round's start-up and throughput) under ``--out``.

    python -m benchmarks.plugin_overhead --rounds 3       # batch 64 x 64 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from benchmarks.common import machine_info, median

CHILD = """
import json, os, sys, time
import psutil
from vllm import LLM, SamplingParams
from constrained.demo import engine_kwargs
from constrained.tiny_model import build_tiny_model
def engine_cpu_s():
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
if __name__ == "__main__":
    batch, tokens = int(sys.argv[1]), int(sys.argv[2])
    model = str(build_tiny_model())
    start = time.perf_counter()
    llm = LLM(model=model, **engine_kwargs())
    startup = time.perf_counter() - start
    prompts = [f"Request {i}: once upon a time" for i in range(batch)]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=tokens, ignore_eos=True)
              for i in range(batch)]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)
    cpu, start = engine_cpu_s(), time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, engine_cpu_s() - cpu
    print("RESULT", json.dumps({"tokens_per_s": batch * tokens / wall, "engine_cpu_s": cpu,
                                "startup_s": startup}))
"""


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "startup_s", "start-up (s)"),
                           (axes[1], "runs", "output tokens/s")):  # fmt: skip
        for name, values in record[key].items():
            ax.plot(range(1, len(values) + 1), values, "o-", label=name)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.legend()
    axes[0].set_title(f"start-up: {record['startup_ratio']:.2f}x with our entry points")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    runs: dict[str, list[float]] = {"entry_points": [], "off": []}
    cpu: dict[str, list[float]] = {"entry_points": [], "off": []}
    startup: dict[str, list[float]] = {"entry_points": [], "off": []}
    for _ in range(args.rounds):
        for name, flag in (("entry_points", "1"), ("off", "0")):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.batch), str(args.tokens)],
                env={**env, "CONSTRAINED_ENTRY_POINTS": flag},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))
            result = json.loads(line[len("RESULT ") :])
            runs[name].append(result["tokens_per_s"])
            cpu[name].append(result["engine_cpu_s"])
            startup[name].append(result["startup_s"])
            print(
                name,
                round(runs[name][-1], 1),
                "tok/s",
                round(cpu[name][-1], 2),
                "s CPU",
                round(startup[name][-1], 1),
                "s start-up",
            )
    record = {
        "command": "python -m benchmarks.plugin_overhead " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "runs": runs,
        "median_tokens_per_s": {k: median(v) for k, v in runs.items()},
        "engine_cpu_s": cpu,
        "median_engine_cpu_s": {k: median(v) for k, v in cpu.items()},
        "startup_s": startup,
        "median_startup_s": {k: median(v) for k, v in startup.items()},
    }
    record["startup_ratio"] = (
        record["median_startup_s"]["entry_points"] / record["median_startup_s"]["off"]
    )
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plugin_overhead.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out_dir / "plugin_overhead.png")
    keys = ("median_tokens_per_s", "median_engine_cpu_s", "median_startup_s", "startup_ratio")
    print(json.dumps({k: record[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
