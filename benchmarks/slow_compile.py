"""One request whose schema takes seconds to compile, in a batch of plain ones (issue #16).

63 plain requests (``--plain-tokens`` tokens each) and, submitted after them in the same
``generate`` call, one request constrained to a MaskBench schema that xgrammar takes seconds
to compile (``--schema``, default ``Snowplow---sp_99_Normalized.json``: 3.8 s here) with a
short output (``--slow-tokens``). Configurations, each in its own child process (own engine),
alternated over ``--rounds`` rounds:

- ``plain``: the 63 plain requests alone (our processors registered);
- ``ours``: plus the slow request, ``extra_args={"json_schema": ..., "grammar_backend":
  "xgrammar"}``: compiled at admission in the frontend process, loaded by the engine from the
  compiled-grammar store;
- ``ours_no_store``: the same with ``CONSTRAINED_GRAMMAR_STORE=off``: the engine compiles the
  schema again when the request joins the batch (what every version before the store did);
- ``vllm``: plus the slow request through vLLM's own structured outputs (xgrammar backend),
  which compiles in the engine while its scheduler holds the request.

Measured: the wall time of the ``generate`` call (the slow request ends long before the plain
ones, so this is when the 63 finish), and every engine step's duration, taken inside the engine
process by a clock processor registered last (``StepClock``, its ``update_state`` runs once a
step). Writes ``slow_compile.json`` and ``slow_compile.png`` (step time against time).

    .venv/bin/python -m benchmarks.slow_compile --out benchmarks/results/compile_once
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor

from benchmarks.common import machine_info, median, percentile, str_list

CONFIGS = ("plain", "ours", "ours_no_store", "vllm")
DEFAULT_SCHEMA = "Snowplow---sp_99_Normalized.json"
CLOCK_ENV = "SLOW_COMPILE_CLOCK"
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
STALL_MS = 250.0  # a step this long is a stall: the median step here is about 55 ms


class StepClock(LogitsProcessor):
    """A V1 logits processor that appends the engine's clock to ``$SLOW_COMPILE_CLOCK`` once a
    step (``update_state`` runs every step); changes nothing."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.path = os.environ[CLOCK_ENV]

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: Any) -> None:
        with open(self.path, "a") as out:
            out.write(f"{time.time()}\n")

    def apply(self, logits: Any) -> Any:
        return logits


def run_child(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process: build the engine, time the one ``generate`` call."""
    from benchmarks.structured.configs import set_engine_env
    from benchmarks.structured.schemas import load_schema, schema_text

    set_engine_env()
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    import constrained
    from constrained.demo import engine_kwargs
    from constrained.tiny_model import build_tiny_model

    kwargs = engine_kwargs()
    clock = "benchmarks.slow_compile:StepClock"
    if config == "vllm":
        kwargs["logits_processors"] = [clock]
        kwargs["structured_outputs_config"] = {"backend": "xgrammar"}
    else:
        kwargs["logits_processors"] = [*constrained.LOGITS_PROCESSORS, clock]
    llm = LLM(model=str(build_tiny_model()), **kwargs)
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)

    text = schema_text(load_schema(args.maskbench, args.schema))
    prompts = [f"Story {i}:" for i in range(args.plain)]
    params = [
        SamplingParams(max_tokens=args.plain_tokens, temperature=1.0, seed=i, ignore_eos=True)
        for i in range(args.plain)
    ]
    if config != "plain":
        slow = {"max_tokens": args.slow_tokens, "temperature": 1.0, "seed": 10_000}
        if config == "vllm":
            slow["structured_outputs"] = StructuredOutputsParams(json=text)
        else:
            slow["extra_args"] = {"json_schema": text, "grammar_backend": "xgrammar"}
        prompts.append("Reply with JSON:")
        params.append(SamplingParams(**slow))
    clock_path = pathlib.Path(os.environ[CLOCK_ENV])
    clock_path.write_text("")
    start = time.time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.time() - start
    stamps = [float(line) for line in clock_path.read_text().split()]
    steps = [(b - a) * 1000.0 for a, b in itertools.pairwise(stamps)]
    slow_out = outputs[-1].outputs[0] if config != "plain" else None
    return {
        "config": config,
        "seconds": seconds,
        "plain_tokens": sum(len(o.outputs[0].token_ids) for o in outputs[: args.plain]),
        "steps": len(steps),
        "step_ms_median": median(steps),
        "step_ms_p99": percentile(steps, 99),
        "step_ms_max": max(steps),
        "stalls_over_ms": STALL_MS,
        "stalls": [round(ms, 1) for ms in steps if ms > STALL_MS],
        "step_times": [
            [round(t - start, 3), round(ms, 2)] for t, ms in zip(stamps[1:], steps, strict=False)
        ],
        "slow_request": None
        if slow_out is None
        else {"finish_reason": slow_out.finish_reason, "text": slow_out.text},
    }


def run_one(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """``config`` in a child process with its own clock file and an empty grammar store."""
    with tempfile.TemporaryDirectory(prefix="slow_compile-") as tmp:
        out = pathlib.Path(tmp) / "result.json"
        env = {
            **os.environ,
            CLOCK_ENV: str(pathlib.Path(tmp) / "clock.txt"),
            "CONSTRAINED_GRAMMAR_STORE": "off"
            if config == "ours_no_store"
            else str(pathlib.Path(tmp) / "grammars"),
        }
        cmd = [sys.executable, "-m", "benchmarks.slow_compile", "_run", config,
               "--schema", args.schema, "--maskbench", str(args.maskbench),
               "--plain", str(args.plain), "--plain-tokens", str(args.plain_tokens),
               "--slow-tokens", str(args.slow_tokens), "--child-out", str(out)]  # fmt: skip
        print(f"== {config}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False)
        if proc.returncode != 0 or not out.exists():
            return {"config": config, "error": f"child exited with status {proc.returncode}"}
        return json.loads(out.read_text())


def summarize(runs: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    plain = [r["seconds"] for r in runs if r.get("config") == "plain" and "error" not in r]
    rows = []
    for config in configs:
        mine = [r for r in runs if r.get("config") == config and "error" not in r]
        if not mine:
            continue
        seconds = median([r["seconds"] for r in mine])
        rows.append(
            {
                "config": config,
                "rounds": len(mine),
                "seconds_median": seconds,
                "seconds_all": [round(r["seconds"], 2) for r in mine],
                "over_plain": seconds / median(plain) if plain else None,
                "step_ms_median": median([r["step_ms_median"] for r in mine]),
                "step_ms_max_all": [round(r["step_ms_max"], 1) for r in mine],
                "stalls_all": [r["stalls"] for r in mine],
            }
        )
    return rows


def plot(runs: list[dict[str, Any]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    shown = set()
    for run in runs:
        if "error" in run or run["config"] in shown:
            continue
        shown.add(run["config"])
        xs, ys = zip(*run["step_times"], strict=True)
        ax.plot(xs, ys, label=run["config"], linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the generate call")
    ax.set_ylabel("engine step (ms, log)")
    ax.set_title("63 plain requests + 1 schema that takes seconds to compile (first round)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.structured.schemas import DEFAULT_MASKBENCH

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "_run"])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--configs", type=str_list, default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--schema", default=DEFAULT_SCHEMA)
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--plain", type=int, default=63)
    parser.add_argument("--plain-tokens", type=int, default=256)
    parser.add_argument("--slow-tokens", type=int, default=8)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    parser.add_argument("--child-out", type=pathlib.Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "_run":
        args.child_out.write_text(json.dumps(run_child(args.config, args)))
        return 0
    runs = []
    for round_index in range(args.rounds):
        for config in args.configs:
            record = run_one(config, args)
            record["round"] = round_index
            runs.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "step_times"}), flush=True)
    summary = summarize(runs, args.configs)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "slow_compile",
        "machine": machine_info(),
        "settings": {k: str(v) for k, v in vars(args).items() if k not in ("command", "config")},
        "summary": summary,
        "runs": runs,
    }
    (args.out / "slow_compile.json").write_text(json.dumps(report, indent=1))
    plot(runs, args.out / "slow_compile.png")
    for row in summary:
        print(json.dumps({k: v for k, v in row.items() if k != "stalls_all"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
