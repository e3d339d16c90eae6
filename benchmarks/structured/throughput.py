"""The ``throughput`` parent: the schema selection, then the configurations alternated.

Runs no engine itself: the ``_select`` child picks the schemas, then each (round,
configuration) is one ``_run`` child (its own engine), in the order round 0: every
configuration, round 1: every configuration, ... so machine noise hits all of them. Writes
``e2e_structured.json`` and ``e2e_structured.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks.common import machine_info
from benchmarks.structured import REPO_ROOT, script_digest
from benchmarks.structured.configs import OURS_EXTRA, SEED_BASE, TEMPERATURE
from benchmarks.structured.plot import plot_throughput
from benchmarks.structured.report import (
    print_round,
    print_throughput_summary,
    throughput_summary,
    write_json,
)
from benchmarks.structured.schemas import prompt_for


def run_child(args: list[str], prime: list[str] | None = None) -> dict[str, Any]:
    """Run ``python -m benchmarks.e2e_structured ARGS --child-out FILE``; its JSON record.

    Each child gets an empty compiled-grammar store of its own, so its cold call compiles
    every schema for the first time (``ours_*``: once, at admission; the engine loads them).
    ``prime``: the arguments of a child run first with the same store (``_prime``: a
    restarted server's store). ``{"error": ...}`` when a child fails or writes nothing.
    """
    with tempfile.TemporaryDirectory(prefix="e2e_structured-") as tmp:
        env = {**os.environ, "CONSTRAINED_GRAMMAR_STORE": str(pathlib.Path(tmp) / "grammars")}
        for step in ([prime] if prime else []) + [args]:
            result = pathlib.Path(tmp) / "result.json"
            cmd = [sys.executable, "-m", "benchmarks.e2e_structured", *step]
            cmd += ["--child-out", str(result)]
            print(f"== {' '.join(cmd)}", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False)
            if proc.returncode != 0 or not result.exists():
                return {"error": f"child exited with status {proc.returncode}"}
        return json.loads(result.read_text())


def _select_args(args: argparse.Namespace) -> list[str]:
    """The ``_select`` child's arguments: every one of our configurations must admit."""
    return [
        "_select",
        "--maskbench",
        str(args.maskbench),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed),
        "--compile-timeout",
        str(args.compile_timeout),
        "--ours",
        ",".join(c for c in args.configs if c in OURS_EXTRA) or "ours",
    ]


def _run_args(
    args: argparse.Namespace, config: str, round_: int, files_path: pathlib.Path
) -> list[str]:
    """The ``_run`` child's arguments; round 0 of our configurations is profiled if asked."""
    extra = []
    if args.profile_dir and config in OURS_EXTRA and round_ == 0:
        prof = pathlib.Path(args.profile_dir) / f"e2e_structured_{config}.prof"
        extra = ["--profile", str(prof)]
    return [
        "_run",
        config,
        "--files",
        str(files_path),
        "--maskbench",
        str(args.maskbench),
        "--tokens",
        str(args.tokens),
        "--warmup-tokens",
        str(args.warmup_tokens),
        *extra,
    ]


def run_throughput(args: argparse.Namespace) -> int:
    """The ``throughput`` subcommand; 1 if the selection or any run failed."""
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "benchmark": "e2e_structured",
        "machine": machine_info(),
        "script_sha1": script_digest(),
        "settings": {
            "batch": args.batch,
            "tokens": args.tokens,
            "warmup_tokens": args.warmup_tokens,
            "rounds": args.rounds,
            "configs": args.configs,
            "restarted": args.restarted,
            "temperature": TEMPERATURE,
            "seed": f"{SEED_BASE} + request index",
            "select_seed": args.seed,
            "maskbench": str(args.maskbench),
            "prompt": prompt_for("NAME.json"),
        },
    }
    selection = run_child(_select_args(args))
    report["selection"] = selection
    if "error" in selection:
        print(f"selection failed: {selection['error']}", file=sys.stderr)
        return 1
    files = [c["file"] for c in selection["chosen"]]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="e2e_structured-files-") as tmp:
        files_path = pathlib.Path(tmp) / "files.json"
        files_path.write_text(json.dumps(files))
        for round_ in range(args.rounds):
            for config in args.configs:
                prime = ["_prime", config] if args.restarted else None
                record = run_child(_run_args(args, config, round_, files_path), prime)
                record.update(config=config, round=round_)
                runs.append(record)
                if "error" not in record:
                    print_round(record)
    report["runs"] = runs
    report["summary"] = throughput_summary(runs, args.configs)
    json_path = out / "e2e_structured.json"
    write_json(json_path, report)
    png_path = out / "e2e_structured.png"
    plot_throughput(report, png_path)
    print_throughput_summary(report["summary"])
    print(f"wrote {json_path} and {png_path}")
    return 1 if any("error" in r for r in runs) else 0
