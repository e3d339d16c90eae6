"""``make gpu-check``: the project's GPU checks in one run, under 6 minutes (issue #28).

On a CUDA machine with PyTorch and Triton but no vLLM and no network, with
``../shared/gpu-kit/`` (wheels, vLLM 0.32.0's Python sources, stand-ins for its compiled
parts). Steps, each with what is left of the time budget:

0. install the kit's wheels and vLLM's sources into ``--site`` (skipped where vLLM imports);
(a) the V2 real-sampler scenarios (``tests/v2_real``) on the device, two at a time, each its
    own process: the harness takes its device from ``CONSTRAINED_V2_DEVICE``, no text edits;
(b) every processor's rows on cuda against the same inputs on the CPU (the kit's
    ``cuda_vs_cpu.py``, V1 interface);
(c) the per-step bench through vLLM's real V2 sampler: ours, vLLM's built-ins, the floor (the
    kit's ``bench.py``, with XTC, no-repeat-ngram and xgrammar added by ``gpu_bench.py``);
(d) the torch profiler over the same steps: kernels per step and device time per kernel
    (``benchmarks/gpu_profile.py``);
(e) typical-p's kernel pass by pass, and its launch settings one at a time
    (``benchmarks/gpu_typical.py``; not on a dry run: it needs CUDA).

(c), (d) and (e) run first, alone on the device (timings); then (a) and (b) side by side.

Steps (b) and (c) run the kit's scripts, (d) ours, with the kit's ``cuda_harness.load_harness``
replaced by a plain import of our harness (the device parameter makes the kit's text edits
unnecessary).
Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (the table). ``--dry-run`` (or
``GPU_DRYRUN=1``): device cpu, Triton's interpreter, the installed vLLM; proves the chain.

    python -m benchmarks.gpu_check [--dry-run] [--out DIR] [--kit DIR] [--budget 345]
                                   [--skip a,b,c,d,e] [--heartbeat 15]

On a lent machine: the kit copied into the checkout as ``gpu-kit/`` (listed in
``.git/info/exclude``) and carried, ``GPU_KIT=$PWD/gpu-kit``, and ``--out`` packed into one
archive under ``$OUT`` (the device returns a few files, not a folder of logs).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import runpy
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = Path(os.environ.get("GPU_KIT", ROOT.parent / "shared" / "gpu-kit"))


def _use_kit(kit: Path, dry: bool) -> None:
    """In this process: the kit's ``cuda_harness`` module, its ``load_harness`` made a plain
    import of our harness (on cuda after the kit's stand-ins for vLLM's compiled parts)."""
    sys.path.insert(0, str(kit))
    sys.path.insert(0, str(ROOT))
    import cuda_harness

    def load_harness():
        if not dry:
            cuda_harness.prepare_vllm_cuda()
        from tests.v2_real import harness

        return harness

    cuda_harness.load_harness = load_harness


def child(args: argparse.Namespace) -> int:
    """One scenario (``--scenario``) or one kit script (``--kit-script``), in this process."""
    _use_kit(args.kit, args.dry_run)
    import cuda_harness

    if args.scenario:
        # A scenario prints nothing until it ends: shortly before its timeout its threads'
        # stacks go to the log, once, so one that times out shows where its time went. (Every
        # 30 s, as before 2026-12-04, a dump crashed a scenario on an H200: faulthandler reads
        # the other threads' frames while they run.)
        if args.heartbeat > 0:
            faulthandler.dump_traceback_later(args.heartbeat)
        cuda_harness.load_harness()
        from tests.v2_real import scenarios

        return scenarios.main([args.scenario])
    script = args.kit / args.kit_script
    if not script.exists():  # one of ours (benchmarks/gpu_profile.py)
        script = ROOT / args.kit_script
    sys.argv = [str(script), *args.rest]
    runpy.run_path(str(script), run_name="__main__")
    return 0


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.steps: dict[str, dict] = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
                    "CONSTRAINED_V2_DEVICE": "cpu" if args.dry_run else "cuda",
                    "GPU_DIR": str(args.kit), "PROJECT_ROOT": str(ROOT),
                    "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1",
                    "DO_NOT_TRACK": "1"}  # fmt: skip
        self.env.setdefault("CONSTRAINED_CACHE", "/tmp/constrained-cache")
        self.env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if args.dry_run:
            self.env["GPU_DRYRUN"] = "1"
        else:
            self.env.pop("GPU_DRYRUN", None)
            self.env.pop("TRITON_INTERPRET", None)
            self.env["GPU_STUBS"] = "1"

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def sub(self, argv: list[str], timeout: float, log: Path, threads: int = 0) -> tuple[int, str]:
        """Run a child, its output streamed to ``log`` (so a timed-out child leaves its
        progress behind), and return its exit status and output. ``threads``: its torch
        threads (0: torch's default), set before it imports torch."""
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
        env = {**self.env, "OMP_NUM_THREADS": str(threads)} if threads else self.env
        if self.args.dry_run:
            cmd.insert(2, "--dry-run")
        with log.open("w") as out:
            try:
                limit = max(5.0, timeout)
                proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=limit)  # fmt: skip
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = 124
        text = log.read_text()
        if rc == 124:
            text += "\nTIMED OUT"
            log.write_text(text)
        return rc, text

    def install(self) -> None:
        try:
            subprocess.run([sys.executable, "-c", "import vllm"], check=True, env=self.env,
                           capture_output=True, timeout=120)  # fmt: skip
            self.steps["install"] = {"rc": 0, "note": "vLLM importable; nothing installed"}
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        site = Path(self.args.site)
        site.mkdir(parents=True, exist_ok=True)
        wheels = sorted(str(w) for w in (self.args.kit / "wheels").glob("*.whl"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site), *wheels]  # fmt: skip
        rc = subprocess.run(pip).returncode
        rc |= subprocess.run(["tar", "-xzf", str(self.args.kit / "vllm-0.32.0-py.tar.gz"),
                              "-C", str(site)]).returncode  # fmt: skip
        (site / "sitecustomize.py").write_text((self.args.kit / "sitecustomize.py").read_text())
        self.env["PYTHONPATH"] = f"{site}:{ROOT}"
        self.steps["install"] = {"rc": rc, "site": str(site), "wheels": len(wheels)}

    def scenarios(self) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.test_v2_real_sampler import LONGEST_FIRST, MINIMUMS

        only = self.args.only.split(",") if self.args.only else LONGEST_FIRST
        names = [n for n in LONGEST_FIRST if n in only]
        share = self.args.scenario_timeout

        def one(name: str) -> dict:
            if self.left() < 20:
                return {"name": name, "status": "skipped: budget spent"}
            t = time.monotonic()
            limit = min(share, self.left() - 10)
            dump_at = max(1.0, limit - self.args.heartbeat) if self.args.heartbeat > 0 else 0
            argv = ["--scenario", name, "--heartbeat", str(dump_at)]
            rc, text = self.sub(argv, limit, self.args.out / f"a_{name}.log")
            counts = None
            for line in text.splitlines():
                if line.startswith("V2REAL "):
                    counts = json.loads(line[len("V2REAL ") :])
            short = {k: v for k, v in MINIMUMS[name].items() if (counts or {}).get(k, 0) < v}
            ok = rc == 0 and counts is not None and not short
            err = "" if ok else (text.strip().splitlines() or ["?"])[-1][:300]
            last_dump = (
                text.rsplit("Timeout (", 1)[1].splitlines()[:16]
                if rc == 124 and "Timeout (" in text
                else []
            )
            return {"name": name, "status": "PASS" if ok else "FAIL", "rc": rc, "error": err,
                    "below_minimum": short, "seconds": round(time.monotonic() - t, 1),
                    "last_stacks": last_dump}  # fmt: skip

        with ThreadPoolExecutor(self.args.jobs) as pool:
            results = list(pool.map(one, names))
        for r in results:
            print(f"[a] {r['status']:5s} {r['name']} {r.get('error', '')}", flush=True)
            for line in r.get("last_stacks", []):
                print(f"[a]     {line}", flush=True)
        self.steps["a_v2_scenarios"] = {"results": results}

    def kit_script(
        self, key: str, script: str, argv: list[str], limit: float, threads: int = 0
    ) -> None:
        if self.left() < 20:
            self.steps[key] = {"status": "skipped: budget spent"}
            return
        t = time.monotonic()
        rc, text = self.sub(["--kit-script", script, "--", *argv],
                            min(limit, self.left() - 5), self.args.out / f"{key}.log",
                            threads)  # fmt: skip
        tail = [ln for ln in text.splitlines() if not re.search(r"WARNING|^\s*$", ln)][-40:]
        print("\n".join(f"[{key[0]}] {ln}" for ln in tail), flush=True)
        self.steps[key] = {"rc": rc, "seconds": round(time.monotonic() - t, 1), "tail": tail}

    def table(self) -> str:
        lines = [f"# make gpu-check ({'CPU dry run' if self.args.dry_run else 'cuda'})", ""]
        a = self.steps.get("a_v2_scenarios", {}).get("results", [])
        lines += ["| scenario | status | seconds |", "|---|---|---|"]
        lines += [f"| {r['name']} | {r['status']} | {r.get('seconds', '-')} |" for r in a]
        bench = self.args.out / "gpu_results.json"
        if bench.exists():
            res = json.loads(bench.read_text())["results"]
            names = sorted({r["config"] for r in res})
            lines += ["", "| vocab | batch | floor ms | " + " | ".join(names) + " |",
                      "|---|---|---|" + "---|" * len(names)]  # fmt: skip
            for vb in sorted({(r["vocab"], r["batch"]) for r in res}):
                row = {r["config"]: r for r in res if (r["vocab"], r["batch"]) == vb}
                floor = next(iter(row.values()))["floor_ms"]
                cells = [f"{row[n]['median_ms']:.3f}" if n in row and row[n]["ok"] else "-"
                         for n in names]  # fmt: skip
                lines.append(f"| {vb[0]:,} | {vb[1]} | {floor:.3f} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dry-run", action="store_true", default=os.environ.get("GPU_DRYRUN") == "1")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    p.add_argument("--kit", type=Path, default=KIT)
    p.add_argument("--site", default=os.environ.get("SITE", "/tmp/gpu_check_site"))
    p.add_argument("--budget", type=float, default=345.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--scenario-timeout", type=float, default=150.0)
    p.add_argument("--only", default="", help="scenarios to run (default: all)")
    p.add_argument("--skip", default="", help="steps to skip: a,b,c,d,e")
    p.add_argument("--bench-timeout", type=float, default=150.0)
    p.add_argument("--bench-only", default="", help="bench configurations (default: all)")
    p.add_argument("--rows-timeout", type=float, default=180.0)
    p.add_argument("--typical-timeout", type=float, default=120.0)
    p.add_argument("--heartbeat", type=float, default=15.0,
                   help="a scenario's stacks dumped once, this many seconds before its "
                        "timeout (0: none)")  # fmt: skip
    p.add_argument("--scenario", default="")
    p.add_argument("--kit-script", default="")
    p.add_argument("rest", nargs="*")
    args = p.parse_args(argv)
    if args.scenario or args.kit_script:
        return child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    run.install()
    skip = set(args.skip.split(","))
    # (c) and (d) first and alone (timings), then (a) and (b) side by side (correctness).
    if "c" not in skip:
        extra = ["--vocabs", "151936", "--only", "pen_bias_minp,vllm_builtin_pen_bias_minp"]
        if not args.dry_run:
            extra = ["--only", args.bench_only] if args.bench_only else []
        run.kit_script("c_bench", "benchmarks/gpu_bench.py",
                       ["--json", str(args.out / "gpu_results.json"), *extra],
                       args.bench_timeout)  # fmt: skip
    if "d" not in skip:
        extra = ["--points", "151936x64", "--only", "none,pen_bias_minp,typical_p"]
        run.kit_script("d_profile", "benchmarks/gpu_profile.py",
                       ["--json", str(args.out / "gpu_profile.json"),
                        *(extra if args.dry_run else [])], 90)  # fmt: skip
    if "e" not in skip and not args.dry_run:
        run.kit_script(
            "e_typical",
            "benchmarks/gpu_typical.py",
            ["--json", str(args.out / "gpu_typical.json")],
            args.typical_timeout,
        )
    # (b) shares the cores with (a)'s scenarios, one torch thread each (the V2 harness).
    rows_threads = max(1, (os.cpu_count() or 1) - args.jobs)
    with ThreadPoolExecutor(1) as side:
        rows = None
        if "b" not in skip:
            rows = side.submit(run.kit_script, "b_cuda_vs_cpu", "cuda_vs_cpu.py",
                               ["--json", str(args.out / "cuda_vs_cpu.json")],
                               args.rows_timeout, rows_threads)  # fmt: skip
        if "a" not in skip:
            run.scenarios()
        if rows is not None:
            rows.result()
    table = run.table()
    (args.out / "gpu_check.md").write_text(table)
    summary = {"dry_run": args.dry_run, "seconds": round(time.monotonic() - run.t0, 1),
               "steps": run.steps}  # fmt: skip
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    print(table)
    a = run.steps.get("a_v2_scenarios", {}).get("results", [])
    bad = [r["name"] for r in a if r["status"] != "PASS"]
    bad += [k for k, v in run.steps.items() if k != "a_v2_scenarios" and v.get("rc", 0)]
    print(f"gpu-check: {summary['seconds']}s, failed: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
