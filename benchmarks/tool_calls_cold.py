"""Tool calls through vLLM's stock OpenAI server, a first (cold) pass and two warm ones: ours
against vLLM's own structured outputs (issue #55, second speed target).

The tools are real user-contributed function schemas: MaskBench's ``Glaiveai2K---*.json``
files (the parameters of functions from the Glaive function-calling dataset), read from
``--maskbench``. Each becomes ``{"type": "function", "function": {"name": NAME,
"description": ..., "parameters": SCHEMA, "strict": true}}``, ``NAME`` taken from the file
name (``Glaiveai2K---calculate_area_1a2b3c4d.json``: ``calculate_area``; MaskBench keeps no
function description, so the description is the name in words). ``--tools`` files with
distinct names are drawn with ``--seed``, keeping only those both configurations admit: a
quick admission probe (one streamed named-``tool_choice`` request per candidate, closed at
its first chunk) on a probe server of each configuration, thrown away afterwards; the
skipped files and each side's refusal are in the JSON.

Two request shapes, ``max_tokens`` ``--max-tokens``, temperature 1.0, seed
``--request-seed + i`` for request ``i``:

- ``named``: one tool per request, ``tool_choice: {"type": "function", "function":
  {"name": NAME}}`` (``--tools`` requests);
- ``required``: two tools per request (disjoint pairs of the selection),
  ``tool_choice: "required"`` (``--tools // 2`` requests).

Configurations, both vLLM's stock server (``python -m vllm.entrypoints.openai.api_server``,
``tests/stock_server.py``) on the embedded tiny Qwen2 model with the same flags
(``--enable-auto-tool-choice --tool-call-parser hermes``, the xgrammar backend with
``disable_any_whitespace``, ``--max-model-len 1024 --max-num-seqs 64``):

- ``ours``: ``VLLM_PLUGINS=constrained``: vLLM's tool parser builds its structural tag,
  admission moves it to our grammar processor (``constrained/openai_routing.py``);
- ``vllm``: ``VLLM_PLUGINS=`` (no endpoint plugin) and ``CONSTRAINED_ENTRY_POINTS=0`` (the
  installed processors inert): vLLM's own structured outputs enforce the same tag.
- ``ours_open`` (only with ``--configs``): ``ours`` with closing off, each request's
  ``vllm_xargs`` ``{"close_at_max_tokens": false}``: what finishing by ``max_tokens`` costs
  (its outputs may be cut, as vLLM's are); its rows carry the same ratios over ``vllm``.

For each shape and configuration a fresh server with an empty compiled-grammar store
(``CONSTRAINED_GRAMMAR_STORE``, a new temporary directory) is started, warmed up with one
plain request and one tool request on a tool outside the selection (the process's one-time
costs: tokenizer tables, the grammar compiler; timed and reported apart), then the shape's
requests are sent by ``--clients`` concurrent clients (threads, one ``httpx`` client), in
three passes: the first (every tool schema new to the server), the second (the same requests
again: the same seeds, so mostly the same outputs, which finds closing's checks of their rows
kept too), and a third with new seeds (``NEW_OUTPUTS_SEED`` on: the schemas known, the outputs
new). The first pass less the third is what the schemas cost new. Per pass: wall time,
per-request latency, output tokens, and for every request its tool calls, each call's
arguments parsed as JSON and validated with ``jsonschema`` against that tool's parameters
(``tests/output_checks.check_output``);
counted as valid (at least one call, every call valid), finished (``finish_reason`` not
``length``) and cut at ``max_tokens``; for ``ours``, the rows that waited for their compile
at their first mask, how long in all, and the rows that took admission's start row instead
(the engine's state snapshot, ``compile_waits``); for every configuration the CPU seconds
each server process used (``cpu_s``: ``api`` the API server, the others by their title).
The configurations' order alternates from one set of servers to the next (a shape's round:
the first shape's, then the next). ``--rounds N`` runs each shape's servers N times (this
machine's pass times drift by more than the gap measured): the table reports each pass's
median over the rounds and every round's, the ratio of the medians, every round's own ratio
(its servers ran one after the other) and their median.
Writes ``tool_calls_cold.json`` and ``tool_calls_cold.png`` under ``--out``.

Usage::

    python -m benchmarks.tool_calls_cold --out benchmarks/results/tool_calls_cold_1202
    python -m benchmarks.tool_calls_cold --tools 4 --clients 2 --out /tmp/smoke   # smoke test
    python -m benchmarks.tool_calls_cold --shapes required --configs ours,vllm,ours_open \
        --out /tmp/closing_cost     # what closing costs
    python -m benchmarks.tool_calls_cold --rounds 3 --out /tmp/rounds   # medians of 3 servers

On a shared machine run it under ``flock /tmp/engine.lock`` with ``HF_HUB_OFFLINE=1
VLLM_CPU_KVCACHE_SPACE=2``: it starts its servers one after another, two probe servers and
then one per shape, configuration and round (six by default).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import pathlib
import random
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import machine_info, median, percentile, str_list
from benchmarks.structured.schemas import DEFAULT_MASKBENCH, load_schema

CONFIGS = ("ours", "vllm")  # every run's, and the two the tool selection is probed on
# Opt-in (``--configs``): ours with closing off, every request's ``vllm_xargs``
# ``close_at_max_tokens: false`` (what closing costs: its outputs may be cut as vLLM's are).
EXTRA_CONFIGS = ("ours_open",)
CONFIG_XARGS: dict[str, dict[str, Any]] = {"ours_open": {"close_at_max_tokens": False}}
# The third pass's requests: the same tools, seeds this far on (warm schemas, new outputs).
NEW_OUTPUTS_SEED = 10_000
SHAPES = ("named", "required")
PREFIX = "Glaiveai2K---"
TOOL_PARSER = "hermes"  # Qwen2/2.5's tool-call format (<tool_call>{JSON}</tool_call>)
SERVER_FLAGS = (
    "--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSER,
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
    "--max-model-len", "1024", "--max-num-seqs", "64",
)  # fmt: skip
# What each configuration changes in the server's environment (besides its grammar store).
CONFIG_ENV = {
    "ours": {"VLLM_PLUGINS": "constrained", "CONSTRAINED_ENTRY_POINTS": "1"},
    "vllm": {"VLLM_PLUGINS": "", "CONSTRAINED_ENTRY_POINTS": "0"},
    "ours_open": {"VLLM_PLUGINS": "constrained", "CONSTRAINED_ENTRY_POINTS": "1"},
}
COLORS = {"ours": "#ff7f0e", "vllm": "#1f77b4", "ours_open": "#ffbb78"}
STATS_FILE = "engine_stats.json"


# --- tools ---------------------------------------------------------------------------------


def function_name(file_name: str) -> str:
    """``Glaiveai2K---calculate_area_1a2b3c4d.json`` -> ``calculate_area``."""
    stem = file_name.removeprefix(PREFIX).removesuffix(".json")
    head, _, tail = stem.rpartition("_")
    return head if head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail) else stem


def make_tool(maskbench: pathlib.Path, file_name: str) -> dict[str, Any]:
    """The OpenAI tool of one MaskBench Glaive file (its schema as the parameters, strict)."""
    name = function_name(file_name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name.replace("_", " "),
            "parameters": load_schema(maskbench, file_name),
            "strict": True,
        },
    }


def candidates(maskbench: pathlib.Path, seed: int) -> list[str]:
    """Every Glaive file, shuffled with ``seed``, the first of each function name only."""
    files = sorted(p.name for p in maskbench.glob(f"{PREFIX}*.json"))
    random.Random(seed).shuffle(files)
    seen: set[str] = set()
    kept = []
    for name in files:
        if function_name(name) not in seen:
            seen.add(function_name(name))
            kept.append(name)
    return kept


def named_request(tool: dict[str, Any], seed: int, max_tokens: int) -> dict[str, Any]:
    name = tool["function"]["name"]
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Call {name}."}],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": name}},
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }


def required_request(tools: list[dict[str, Any]], seed: int, max_tokens: int) -> dict[str, Any]:
    names = " or ".join(t["function"]["name"] for t in tools)
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Call {names}."}],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }


def shape_requests(
    shape: str, tools: list[dict[str, Any]], first_seed: int, max_tokens: int
) -> list[dict[str, Any]]:
    """The requests of one shape: one per tool (``named``), one per disjoint pair
    (``required``)."""
    if shape == "named":
        return [named_request(t, first_seed + i, max_tokens) for i, t in enumerate(tools)]
    pairs = [tools[i : i + 2] for i in range(0, len(tools) - 1, 2)]
    return [required_request(p, first_seed + i, max_tokens) for i, p in enumerate(pairs)]


# --- servers -------------------------------------------------------------------------------


@contextlib.contextmanager
def server_of(config: str, model: str, workdir: pathlib.Path):
    """A fresh stock server of ``config`` with an empty grammar store; yields ``(server,
    startup_s)`` and stops it afterwards."""
    from tests.stock_server import start_stock_server

    env = {
        **CONFIG_ENV[config],
        "CONSTRAINED_GRAMMAR_STORE": str(workdir / "grammars"),
        "CONSTRAINED_STATS_PATH": str(workdir / STATS_FILE),  # (only ours writes it)
        "CONSTRAINED_STATS_INTERVAL_S": "0.2",
    }
    saved = {k: os.environ.get(k) for k in env}
    plugins = env.pop("VLLM_PLUGINS")
    os.environ.update(env)  # start_stock_server passes os.environ on; this process runs no engine
    try:
        start = time.perf_counter()
        server = start_stock_server(model, workdir, SERVER_FLAGS, plugins=plugins)
        startup = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield server, startup
    finally:
        server.stop()


def post(client: Any, base: str, body: dict[str, Any]) -> tuple[int, Any, float]:
    """``(status, JSON body or text, seconds)`` of one chat completion."""
    start = time.perf_counter()
    resp = client.post(base + "/v1/chat/completions", json=body)
    seconds = time.perf_counter() - start
    try:
        return resp.status_code, resp.json(), seconds
    except ValueError:
        return resp.status_code, resp.text, seconds


def probe(client: Any, base: str, body: dict[str, Any]) -> str | None:
    """``None`` when the server admits ``body`` (streamed; closed at its first data chunk,
    which comes once the engine produced a token, its grammar compiled), else why not."""
    with client.stream(
        "POST", base + "/v1/chat/completions", json={**body, "stream": True}
    ) as resp:
        if resp.status_code != 200:
            resp.read()
            return f"HTTP {resp.status_code}: {_error_text(resp.text)}"
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return None
            chunk = json.loads(data)
            if "error" in chunk:
                return f"stream error: {_error_text(data)}"
            return None
    return "no data"


def _error_text(text: str) -> str:
    try:
        found = json.loads(text)
        found = found.get("error", found)
        message = found.get("message", str(found)) if isinstance(found, dict) else str(found)
    except (ValueError, AttributeError):
        message = text
    return " ".join(str(message).split())[:300]


# --- judging -------------------------------------------------------------------------------


def judge(status: int, body: Any, request: dict[str, Any]) -> dict[str, Any]:
    """What one response holds: finish reason, tokens, each tool call checked."""
    from tests.output_checks import check_output

    if status != 200 or not isinstance(body, dict):
        return {"status": "error", "http": status, "error": _error_text(json.dumps(body))}
    choice = body["choices"][0]
    message = choice.get("message") or {}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in request["tools"]}
    calls = []
    for call in message.get("tool_calls") or []:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name not in schemas:
            calls.append({"name": name, "status": "unknown_tool", "arguments": arguments})
            continue
        verdict, detail = check_output(arguments, schemas[name])
        calls.append({"name": name, "status": verdict, "detail": detail, "arguments": arguments,
                      "strict_json": verdict == "not_json" or strict_json(arguments)})  # fmt: skip
    if not calls:
        verdict = "no_call"
    elif all(c["status"] == "valid" for c in calls):
        verdict = "valid"
    else:
        verdict = next(c["status"] for c in calls if c["status"] != "valid")
    return {
        "status": verdict,
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": (body.get("usage") or {}).get("completion_tokens", 0),
        "calls": calls,
        "content": (message.get("content") or "")[:200],
    }


def strict_json(text: str) -> bool:
    """``text`` parses as JSON without Python's extensions (``NaN``, ``Infinity``): vLLM's
    tool parsers load the model's arguments and dump them again, so a number too large for a
    float (``1e999``, valid JSON) comes back as ``Infinity``, which Python reads and
    ``jsonschema`` accepts as a number but strict JSON parsers refuse."""

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def pass_summary(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    n = len(records)
    tokens = sum(r.get("completion_tokens", 0) for r in records)
    latencies = [r["latency_s"] for r in records]
    return {
        "requests": n,
        "wall_s": wall,
        "valid": sum(r["status"] == "valid" for r in records),
        "finished": sum(r.get("finish_reason") not in (None, "length") for r in records),
        "cut_at_max_tokens": sum(r.get("finish_reason") == "length" for r in records),
        "errors": sum(r["status"] == "error" for r in records),
        "tool_calls": sum(len(r.get("calls", ())) for r in records),
        "calls_not_strict_json": sum(
            not c.get("strict_json", True) for r in records for c in r.get("calls", ())
        ),
        "statuses": dict(collections.Counter(r["status"] for r in records)),
        "finish_reasons": dict(collections.Counter(str(r.get("finish_reason")) for r in records)),
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall if wall else None,
        "latency_median_s": median(latencies) if latencies else None,
        "latency_p90_s": percentile(latencies, 90) if latencies else None,
    }


def run_pass(
    client: Any, base: str, requests: list[dict[str, Any]], clients: int
) -> tuple[float, list[dict[str, Any]]]:
    """Send every request, ``clients`` at a time; ``(wall seconds, records in order)``."""
    records: list[dict[str, Any] | None] = [None] * len(requests)
    lock = threading.Lock()
    todo = iter(range(len(requests)))

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            status, body, seconds = post(client, base, requests[i])
            record = judge(status, body, requests[i])
            record["tools"] = [t["function"]["name"] for t in requests[i]["tools"]]
            record["latency_s"] = seconds
            records[i] = record

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(worker) for _ in range(clients)]:
            future.result()
    return time.perf_counter() - start, records  # type: ignore[return-value]


def same_calls(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    """How many requests got the same tool calls (names and argument text) in both passes."""

    def key(r: dict[str, Any]) -> list[tuple[str, str]]:
        return [(c["name"], c["arguments"]) for c in r.get("calls", ())]

    return sum(key(x) == key(y) and x["status"] != "error" for x, y in zip(a, b, strict=True))


# --- the parts -----------------------------------------------------------------------------


def select_tools(
    args: argparse.Namespace, model: str, client: Any, tmp: pathlib.Path
) -> dict[str, Any]:
    """Probe candidates on one server of each configuration until ``--tools`` (+1 for the
    warm-up) are admitted by both; the chosen files, the skipped ones and why."""
    pool = candidates(args.maskbench, args.seed)
    need = args.tools + 1  # the last admitted one is the warm-up tool
    verdicts: dict[str, dict[str, str | None]] = {c: {} for c in CONFIGS}
    with contextlib.ExitStack() as stack:
        bases = {}
        for config in CONFIGS:
            workdir = tmp / f"probe-{config}"
            workdir.mkdir()
            server, startup = stack.enter_context(server_of(config, model, workdir))
            bases[config] = server.base
            print(f"probe server {config}: up in {startup:.1f} s", flush=True)
        admitted: list[str] = []
        start, chunk = 0, need + max(4, need // 4)
        while len(admitted) < need and start < len(pool):
            batch = pool[start : start + chunk]
            start += len(batch)
            for config in CONFIGS:
                bodies = [named_request(make_tool(args.maskbench, f), 0, args.max_tokens)
                          for f in batch]  # fmt: skip
                with concurrent.futures.ThreadPoolExecutor(args.clients) as ex:
                    found = list(ex.map(lambda b, c=config: probe(client, bases[c], b), bodies))
                verdicts[config].update(zip(batch, found, strict=True))
            admitted += [f for f in batch if all(verdicts[c][f] is None for c in CONFIGS)]
            chunk = max(4, (need - len(admitted)) * 2)
    probed = [f for f in pool if f in verdicts[CONFIGS[0]]]
    skipped = [
        {"file": f, **{f"{c}_refusal": verdicts[c][f] for c in CONFIGS}}
        for f in probed
        if any(verdicts[c][f] is not None for c in CONFIGS)
    ]
    if len(admitted) < need:
        raise SystemExit(f"only {len(admitted)} Glaive files admitted by both; need {need}")
    chosen = admitted[:need]
    probed = probed[: probed.index(chosen[-1]) + 1]  # candidates looked at, in order
    skipped = [s for s in skipped if s["file"] in probed]
    counts = {
        f"refused_by_{c}": sum(s[f"{c}_refusal"] is not None for s in skipped) for c in CONFIGS
    }
    counts["refused_by_both"] = sum(all(s[f"{c}_refusal"] for c in CONFIGS) for s in skipped)
    return {
        "candidates_probed": len(probed),
        "skipped": skipped,
        "skipped_count": len(skipped),
        "skipped_counts": counts,
        "files": chosen[: args.tools],
        "warmup_file": chosen[-1],
    }


def run_config(
    args: argparse.Namespace,
    config: str,
    shape: str,
    model: str,
    client: Any,
    tools: list[dict[str, Any]],
    warmup_tool: dict[str, Any],
    tmp: pathlib.Path,
    round_: int = 0,
) -> dict[str, Any]:
    """One fresh server: warm-up, then the shape's three passes."""
    requests = shape_requests(shape, tools, args.request_seed, args.max_tokens)
    fresh = shape_requests(shape, tools, args.request_seed + NEW_OUTPUTS_SEED, args.max_tokens)
    xargs = CONFIG_XARGS.get(config)
    if xargs:
        requests, fresh = ([{**r, "vllm_xargs": xargs} for r in rs] for rs in (requests, fresh))
    workdir = tmp / f"{shape}-{config}-{round_}"
    workdir.mkdir()
    with server_of(config, model, workdir) as (server, startup):
        plain = {"model": "tiny", "messages": [{"role": "user", "content": "Hello."}],
                 "max_tokens": 8, "temperature": 1.0, "seed": 0}  # fmt: skip
        _, _, plain_s = post(client, server.base, plain)
        warm = named_request(warmup_tool, 0, args.max_tokens)
        if shape == "required":
            warm = required_request([warmup_tool], 0, args.max_tokens)
        if xargs:
            warm = {**warm, "vllm_xargs": xargs}
        status, body, tool_s = post(client, server.base, warm)
        warmup = {"plain_s": plain_s, "tool_s": tool_s, "tool": judge(status, body, warm)}
        passes = []
        waits, cpu = compile_waits(workdir), server_cpu(server.proc.pid)
        for number, sent in ((1, requests), (2, requests), (3, fresh)):
            wall, records = run_pass(client, server.base, sent, args.clients)
            summary = pass_summary(records, wall)
            waits, before = compile_waits(workdir), waits
            if waits is not None and before is not None:  # (ours: its engine's stats)
                summary["compile_waits"] = {k: round(waits[k] - before[k], 4) for k in waits}
            cpu, cpu_before = server_cpu(server.proc.pid), cpu
            summary["cpu_s"] = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in cpu.items()}
            passes.append({"pass": number, "summary": summary, "records": records})
            print(
                f"{shape:8s} {config:4s} round {round_} pass {number}: {wall:7.2f} s, valid "
                f"{summary['valid']}/{summary['requests']}, cut {summary['cut_at_max_tokens']}, "
                f"errors {summary['errors']}, {summary['completion_tokens']} tokens",
                flush=True,
            )
    return {
        "shape": shape,
        "config": config,
        "round": round_,
        "startup_s": startup,
        "warmup": warmup,
        "same_calls_both_passes": same_calls(passes[0]["records"], passes[1]["records"]),
        "passes": passes,
    }


def server_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user and system) the server's processes have used so far: the API
    server (``api``) and each child by its title (``VLLM::EngineCore``, ...), summed by
    title. A pass's difference says which process its time went to."""
    import psutil

    found: dict[str, float] = {}
    try:
        root = psutil.Process(pid)
        for label, proc in [("api", root), *((None, c) for c in root.children(recursive=True))]:
            try:
                times = proc.cpu_times()
                name = label or proc.name()
            except psutil.Error:
                continue
            found[name] = found.get(name, 0.0) + times.user + times.system
    except psutil.Error:
        pass
    return found


def compile_waits(workdir: pathlib.Path) -> dict[str, float] | None:
    """The engine's rows that waited for their compile so far, how long in all, and the rows
    that took admission's first row instead (``compile_waits`` of our processors' state
    snapshots: ``count``, ``seconds``, ``started``; summed over its workers), or ``None``
    where none is written (vLLM's own structured outputs). The engine writes a snapshot at
    a batch change at most every 0.2 s: a wait after the last one of a pass counts in the
    next (a pass's last rows start seconds before it ends, so the waits of its new rows are
    in)."""
    found = None
    for path in workdir.glob(STATS_FILE.replace(".json", "*.json")):
        try:
            waits = json.loads(path.read_text())["compile_waits"]
        except (OSError, ValueError, KeyError):
            continue
        found = found or dict.fromkeys(waits, 0)
        found = {k: found.get(k, 0) + v for k, v in waits.items()}
    return found


def _order(shape: str, config: str) -> tuple[int, int]:
    return SHAPES.index(shape), (*CONFIGS, *EXTRA_CONFIGS).index(config)


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per shape and configuration: each pass's median wall time over the rounds
    (and every round's), the fewest valid calls of any round, with the ours/vllm ratios on
    ours' rows (``ours``, ``ours_open``): of the medians, and round by round."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for run in runs:
        by[(run["shape"], run["config"])].append(run)
    walls = {k: _walls(v) for k, v in by.items()}  # per pass, each round's wall time
    rows = []
    for (shape, config), mine in sorted(by.items(), key=lambda kv: _order(*kv[0])):
        first, second, third = ([r["passes"][i]["summary"] for r in mine] for i in range(3))
        own = walls[(shape, config)]
        medians = [median(w) for w in own]
        row = {
            "shape": shape,
            "config": config,
            "rounds": len(mine),
            "requests": first[0]["requests"],
            "first_s": medians[0],
            "second_s": medians[1],
            "third_s": medians[2],
            "first_s_rounds": own[0],
            "second_s_rounds": own[1],
            "third_s_rounds": own[2],
            # (each round's own difference: medians may be of different servers)
            "cold_penalty_s": median([a - b for a, b, _ in zip(*own, strict=True)]),
            "schemas_cost_s": median([a - c for a, _, c in zip(*own, strict=True)]),
            "warmup_tool_s": median([r["warmup"]["tool_s"] for r in mine]),
            "startup_s_rounds": [r["startup_s"] for r in mine],
            "valid_first": min(p["valid"] for p in first),
            "valid_second": min(p["valid"] for p in second),
            "valid_third": min(p["valid"] for p in third),
            "finished_first": min(p["finished"] for p in first),
            "cut_first": max(p["cut_at_max_tokens"] for p in first),
            "errors_first": max(p["errors"] for p in first),
            "calls_not_strict_json_first": max(
                (
                    p["calls_not_strict_json"]
                    for p in first
                    if p.get("calls_not_strict_json") is not None
                ),
                default=None,
            ),
            "tokens_first": [p["completion_tokens"] for p in first],
            "tokens_second": [p["completion_tokens"] for p in second],
            "tokens_third": [p["completion_tokens"] for p in third],
            "compile_waits": [
                [p.get("compile_waits") for p in ps]
                for ps in zip(first, second, third, strict=True)
            ],
        }
        other = walls.get((shape, "vllm"))
        if config != "vllm" and other:
            for i, name in enumerate(("first", "second", "third")):
                row[f"{name}_ratio_ours_over_vllm"] = medians[i] / median(other[i])
                row[f"{name}_ratio_rounds"] = [
                    a / b for a, b in zip(own[i], other[i], strict=False)
                ]
                row[f"{name}_ratio_median_of_rounds"] = median(row[f"{name}_ratio_rounds"])
        rows.append(row)
    return rows


def _walls(runs: list[dict[str, Any]]) -> list[list[float]]:
    """Each pass's wall time, round by round."""
    ordered = sorted(runs, key=lambda r: r.get("round", 0))
    return [[r["passes"][i]["summary"]["wall_s"] for r in ordered] for i in range(3)]


def plot(record: dict[str, Any], path: pathlib.Path) -> None:
    """Per shape: each pass's wall time for each configuration, valid counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = record["table"]
    shapes = [s for s in SHAPES if any(r["shape"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        mine = sorted(
            (r for r in rows if r["shape"] == shape), key=lambda r: _order(shape, r["config"])
        )
        for i, r in enumerate(mine):
            bars = (("first_s", "first", "valid_first"), ("second_s", "second", "valid_second"),
                    ("third_s", "new outputs", "valid_third"))  # fmt: skip
            for j, (key, label, valid_key) in enumerate(bars):
                x = i + (j - 1) * 0.27
                ax.bar(x, r[key], 0.25, color=COLORS.get(r["config"], "#777777"),
                       alpha=(1.0, 0.5, 0.75)[j])  # fmt: skip
                rounds = r.get(f"{key}_rounds", [])
                if len(rounds) > 1:  # each round's pass, on its median's bar
                    ax.plot([x] * len(rounds), rounds, "k.", markersize=4)
                valid = r[valid_key]
                text = f"{label}\n{r[key]:.1f} s\nvalid {valid}/{r['requests']}"
                ax.text(x, max(r[key], *rounds), text, ha="center", va="bottom", fontsize=8)
        top = max([1.0, *(x for r in mine for x in (r["first_s"], *r.get("first_s_rounds", ())))])
        ax.set_ylim(0, top * 1.35)
        ax.set_xticks(range(len(mine)), [r["config"] for r in mine])
        ax.set_ylabel("wall time of the pass (s)")
        ours = next((r for r in mine if r["config"] == "ours"), None)
        ratio = ""
        if ours and "first_ratio_ours_over_vllm" in ours:
            ratio = (f"\nours/vllm: first {ours['first_ratio_ours_over_vllm']:.2f}, "
                     f"second {ours['second_ratio_ours_over_vllm']:.2f}, "
                     f"new outputs {ours['third_ratio_ours_over_vllm']:.2f}")  # fmt: skip
        title = "named tool_choice, 1 tool" if shape == "named" else "required, 2 tools"
        ax.set_title(f"{title}, {mine[0]['requests']} requests{ratio}", fontsize=10)
    s, m = record["settings"], record["machine"]
    rounds = s.get("rounds", 1)
    medians = f"\nmedians of {rounds} servers each (dots: every server's)" if rounds > 1 else ""
    fig.suptitle(
        f"Tool calls, {s['tools']} Glaive tools, {s['clients']} clients, max_tokens "
        f"{s['max_tokens']}, T=1;\n{m['cpu_model']} x{m['cpu_cores']}, vLLM {m['vllm']}"
        f"{medians}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", type=int, default=60, help="Glaive tool schemas used")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0, help="seed of the tool selection")
    parser.add_argument("--request-seed", type=int, default=1000, help="seed of request 0")
    parser.add_argument("--shapes", type=str_list, default=list(SHAPES), help=",".join(SHAPES))
    parser.add_argument("--configs", type=str_list, default=list(CONFIGS),
                        help=f"of {','.join((*CONFIGS, *EXTRA_CONFIGS))}")  # fmt: skip
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--rounds", type=int, default=1,
                        help="servers per shape and configuration, orders alternating")  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/tool_calls_cold")
    args = parser.parse_args(argv)
    if any(s not in SHAPES for s in args.shapes):
        parser.error(f"--shapes: choose from {SHAPES}")
    if any(c not in (*CONFIGS, *EXTRA_CONFIGS) for c in args.configs):
        parser.error(f"--configs: choose from {(*CONFIGS, *EXTRA_CONFIGS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.tools < 2 or args.tools % 2:
        parser.error("--tools must be even and at least 2 (the required shape pairs them)")
    return args


def main(argv: list[str] | None = None) -> int:
    import httpx

    from constrained.tiny_model import build_tiny_model
    from tests.stock_server import BASE_FLAGS

    args = parse_args(argv)
    model = str(build_tiny_model())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    limits = httpx.Limits(max_connections=args.clients + 4)
    with (
        tempfile.TemporaryDirectory(prefix="tool_calls_cold-") as tmp_name,
        httpx.Client(timeout=900, limits=limits) as client,
    ):
        tmp = pathlib.Path(tmp_name)
        selection = select_tools(args, model, client, tmp)
        print(
            f"tools: {len(selection['files'])} chosen, {selection['skipped_count']} skipped of "
            f"{selection['candidates_probed']} probed {selection['skipped_counts']}",
            flush=True,
        )
        tools = [make_tool(args.maskbench, f) for f in selection["files"]]
        warmup_tool = make_tool(args.maskbench, selection["warmup_file"])
        runs, k = [], 0
        for shape in args.shapes:
            for round_ in range(args.rounds):
                order = args.configs if k % 2 == 0 else args.configs[::-1]
                k += 1
                for config in order:
                    runs.append(run_config(args, config, shape, model, client, tools,
                                           warmup_tool, tmp, round_))  # fmt: skip
    record = {
        "benchmark": "tool_calls_cold",
        "command": machine["command"],
        "machine": machine,
        "machine_after": {"load_average_1_5_15": list(os.getloadavg())},
        "settings": {
            "tools": args.tools,
            "clients": args.clients,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "seed": args.seed,
            "request_seed": args.request_seed,
            "new_outputs_seed": args.request_seed + NEW_OUTPUTS_SEED,
            "shapes": args.shapes,
            "rounds": args.rounds,
            "model": model,
            "server": "python -m vllm.entrypoints.openai.api_server (tests/stock_server.py)",
            "server_flags": [*BASE_FLAGS, *SERVER_FLAGS],
            "configs": args.configs,
            "config_env": {c: CONFIG_ENV[c] for c in args.configs},
            "config_vllm_xargs": {c: CONFIG_XARGS[c] for c in args.configs if c in CONFIG_XARGS},
            "grammar_store": "a new empty CONSTRAINED_GRAMMAR_STORE per server",
            "maskbench": str(args.maskbench),
            "tool_description": "the function name in words (MaskBench keeps none)",
        },
        "selection": selection,
        "table": table(runs),
        "runs": runs,
    }
    (out / "tool_calls_cold.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out / "tool_calls_cold.png")
    for row in record["table"]:
        ratios = ""
        if "first_ratio_ours_over_vllm" in row:
            ratios = (f"  ours/vllm first {row['first_ratio_ours_over_vllm']:.2f} "
                      f"second {row['second_ratio_ours_over_vllm']:.2f} "
                      f"new outputs {row['third_ratio_ours_over_vllm']:.2f}")  # fmt: skip
            if row["rounds"] > 1:
                ratios += (
                    "  rounds (first) "
                    + ", ".join(f"{x:.2f}" for x in row["first_ratio_rounds"])
                    + f", their median {row['first_ratio_median_of_rounds']:.2f}"
                )
        print(
            f"{row['shape']:8s} {row['config']:4s} first {row['first_s']:7.2f} s  second "
            f"{row['second_s']:7.2f} s  new outputs {row['third_s']:7.2f} s  valid "
            f"{row['valid_first']}/{row['requests']}, {row['valid_second']}/{row['requests']}, "
            f"{row['valid_third']}/{row['requests']}"
            f"  cut {row['cut_first']}{ratios}"
        )
    print(f"wrote {out / 'tool_calls_cold.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
