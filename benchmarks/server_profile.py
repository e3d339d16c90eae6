"""Where a stock server's time goes, ours against vLLM's own, from a py-spy recording of
``benchmarks.tool_calls_cold`` (#55).

A server is three processes: the API server, vLLM's engine core (the scheduler) and its
worker (the model, the sampler, our processors and their fill thread). On the 2-core CPU
the engine core and the worker each poll for the other, a core each, so CPU time follows
wall time there and does not say what a pass waits on. A sampling profile does: this reads
py-spy's raw output (one line a stack, ``;``-joined frames, then a sample count) and
counts, for each benchmark server, the samples in each of ``PARTS``: the first whose
frame is on a sample's stack takes it (a part's own callees in later parts are not
double-counted). Samples are thread samples (the fill thread's beside the worker's main
thread) taken at ``--rate`` a second of each thread on a CPU, in Python or native code,
start-up included; an idle thread is not sampled, nor one waiting for the GIL.

A process is named by the frames most of its samples hold (``EngineCoreProc``: the engine
core, ``WorkerProc``: the worker; the API server is the benchmark's child); a server is
ours where its worker ran our fill (``mask_fill.py``; vLLM's own server imports
``constrained`` too, so that alone does not tell); of each kind the one with the most
samples is the benchmark's (the others are the probes of tool selection).

Record, then summarise (py-spy is not a dependency: ``pip install py-spy``)::

    py-spy record --subprocesses --format raw -r 50 -o /tmp/spy.txt -- \\
        python -m benchmarks.tool_calls_cold --shapes required --rounds 1 --out /tmp/tcc
    python -m benchmarks.server_profile /tmp/spy.txt --rate 50 \\
        --out benchmarks/results/server_profile_required

Writes ``server_profile.json`` and ``server_profile.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections import Counter, defaultdict

# (process, part, a frame that marks it): the first part whose frame is on the stack
PARTS: tuple[tuple[str, str, str], ...] = (
    ("worker", "our fill: closing", "ClosingMatcher._narrow_own "),
    ("worker", "our fill: the rest", "V1MaskFill._fill "),
    ("worker", "forward: layers", "GPUModelRunner._model_forward "),
    ("worker", "forward: lm head", "compute_logits "),
    ("worker", "logits processors applied", "Sampler.apply_logits_processors "),
    ("worker", "vLLM's grammar mask applied", "apply_grammar_bitmask "),
    ("worker", "sampling (gumbel argmax)", "TopKTopPSampler.forward"),
    ("worker", "polling for the next step", "MessageQueue.dequeue "),
    ("engine", "vLLM's structured outputs", "StructuredOutputManager"),
    ("engine", "waiting for sampling", "MultiprocExecutor.sample_tokens "),
    ("engine", "waiting for execute_model", "FutureWrapper.result "),
    ("engine", "scheduling", "Scheduler."),
)
_PROCESS = re.compile(r"^process (\d+):")  # then its command line, which may hold ";"
_FRAME = re.compile(r"\(.*:\d+\)$")  # "function (file:line)"


def read(path: pathlib.Path) -> list[tuple[list[int], list[str], int]]:
    """Each raw line's process chain (pids, outermost first), frames and sample count."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        pids, frames = [], []
        for part in stack.split(";"):
            found = _PROCESS.match(part)
            if found:
                pids.append(int(found.group(1)))
            elif _FRAME.search(part):
                frames.append(part)
        stacks.append((pids, frames, int(count)))
    return stacks


def process_names(stacks: list[tuple[list[int], list[str], int]]) -> dict[int, str]:
    """Each process's name: ``api`` (the benchmark's child), ``engine`` or ``worker`` (the
    marker most of its samples hold), else ``other`` (a resource tracker, a probe's)."""
    marks: dict[int, Counter] = defaultdict(Counter)
    for pids, frames, count in stacks:
        if len(pids) >= 3:
            for name, mark in (("engine", "EngineCoreProc"), ("worker", "WorkerProc")):
                if any(mark in frame for frame in frames):
                    marks[pids[-1]][name] += count
    names = {}
    for pids, _, _ in stacks:
        if len(pids) == 2:
            names[pids[1]] = "api"
        elif len(pids) >= 3:
            found = marks[pids[-1]].most_common(1)
            names[pids[-1]] = found[0][0] if found else "other"
    return names


def summarise(stacks: list[tuple[list[int], list[str], int]], rate: float) -> dict:
    """Per server (ours, vLLM's): samples and seconds of each process and part.

    Raises:
        ValueError: no stack holds a frame (not py-spy's raw format with line numbers).
    """
    if not any(frames for _, frames, _ in stacks):
        raise ValueError("no frames read: record with py-spy's --format raw, line numbers on")
    names = process_names(stacks)
    servers: dict[int, dict] = defaultdict(lambda: {"ours": False, "processes": Counter(),
                                                    "parts": Counter()})  # fmt: skip
    for pids, frames, count in stacks:
        if len(pids) < 2:
            continue  # the benchmark's own process
        server = servers[pids[1]]
        process = names[pids[-1]]
        server["processes"][process] += count
        if any("mask_fill.py" in frame for frame in frames):
            server["ours"] = True
        for where, part, mark in PARTS:
            if where == process and any(mark in frame for frame in frames):
                server["parts"][f"{where}: {part}"] += count
                break
    chosen: dict[str, dict] = {}
    for server in servers.values():
        kind = "ours" if server["ours"] else "vllm"
        total = sum(server["processes"].values())
        if kind not in chosen or total > chosen[kind]["samples"]:
            chosen[kind] = {
                "samples": total,
                "seconds": {k: v / rate for k, v in server["processes"].items()},
                "parts_seconds": {
                    f"{w}: {p}": server["parts"][f"{w}: {p}"] / rate for w, p, _ in PARTS
                },
            }
    return chosen


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{w}: {p}" for w, p, _ in PARTS]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    height = 0.4
    for k, (kind, colour) in enumerate((("ours", "#264653"), ("vllm", "#e76f51"))):
        if kind not in result:
            continue
        values = [result[kind]["parts_seconds"][label] for label in labels]
        ax.barh([i + k * height for i in range(len(labels))], values, height, color=colour,
                label=kind)  # fmt: skip
    ax.set_yticks([i + height / 2 for i in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.set_xlabel("thread-seconds sampled (whole recording)")
    ax.set_title("Where each stock server's time goes (py-spy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=pathlib.Path, help="py-spy's --format raw output")
    parser.add_argument("--rate", type=float, default=50.0, help="py-spy's -r")
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path("benchmarks/results/server_profile"))  # fmt: skip
    args = parser.parse_args(argv)
    from benchmarks.common import machine_info

    result = summarise(read(args.raw), args.rate)
    record = {
        "command": "python -m benchmarks.server_profile " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "result": result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "server_profile.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(result, args.out / "server_profile.png")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
