"""Soak: our server under concurrent mixed load, faults and bad input. It stops by itself.

Starts our launcher (``python -m constrained serve``) on loopback with the tiny model, a KV
cache far smaller than the load needs (so vLLM preempts and resumes requests) and
``CONSTRAINED_STATS_PATH`` set (the engine process writes what our processors hold, see
``constrained/processors/stats.py``). Then, for ``--rounds`` rounds of ``--round-s`` seconds,
``--concurrency`` clients loop over a random mix of requests, streaming or not:

- ``plain`` (no options), ``penalties``, ``bias``, ``min_p``, ``schema`` (a MaskBench schema
  ``auto`` admits, or a small hand-written one), ``regex``;
- ``probe``: one of a few seeded requests with our options whose output alone is recorded
  before the load (must be identical under load);
- ``bad``: a malformed request from ``tests/bad_requests.py`` (must get 400 naming the field);
- ``disconnect``: a streaming request the client drops after a few chunks.

After each round the load stops, a plain request lets the engine retire finished rows, and
the round records: requests by kind and outcome, vLLM's preemption counter (``/metrics``),
the engine's snapshot (our slots in use, per-request objects, compile-cache entries) and the
resident memory of the server and engine processes.

Checks (``failures`` in the report; the exit status is 1 when any): no good request got an
error; every constrained output that finished with "stop" validates (``jsonschema`` with the
schema's draft, or the regex in full); every probe equals its alone run; every bad request got
400 naming its field; after each round no slot or per-request object is left and the compile
cache is within its bound; memory does not grow after the first round (over ``--rss-slack-mb``;
before round 1 a warm-up sends each schema and regex of the mix once, so each process has
compiled all of them and round 1 is the warm baseline);
``/health`` answers 200 at the end.

Usage (the command line is ``benchmarks/soak.py``; ``tests/test_soak.py`` runs a short soak)::

    python -m benchmarks.soak                        # 5 rounds of 60 s, 64 clients
    python -m benchmarks.soak --rounds 2 --round-s 20 # quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

REPO = pathlib.Path(__file__).resolve().parent.parent
MASKBENCH = REPO.parent / "shared" / "data" / "maskbench"
SLOW_XGRAMMAR = "Github_easy---o12088.json"  # a schema xgrammar compiles in about 1 s here
OUT = REPO / "benchmarks" / "results"

REGEXES = [
    r"[A-Z]{2}-[0-9]{3}",
    r"(yes|no|maybe)",
    r"[0-9]{1,3}(\.[0-9]{1,3}){3}",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",  # \d is Unicode digits in llguidance, as in Python
]
SMALL_SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer"}, "maxItems": 5},
    {"enum": ["red", "green", "blue"]},
]
PROMPTS = ["Hello", "The weather today is", "def main():", "JSON please:", "1, 2, 3,"]
# Seeded requests with our options whose outputs must not depend on the rest of the batch.
PROBES: list[dict[str, Any]] = [
    {"seed": 11, "vllm_xargs": {"repetition_penalty": 1.3, "frequency_penalty": 0.5}},
    {"seed": 12, "vllm_xargs": {"logit_bias": '{"11": 3.0, "13": 2.0}', "min_p": 0.05}},
    {"seed": 13, "vllm_xargs": {"regex": r"[a-z]{3,8}( [a-z]{3,8}){2}"}},
    {"seed": 14, "vllm_xargs": {"json_schema": json.dumps(SMALL_SCHEMAS[0])}},
    {"seed": 15, "vllm_xargs": {"presence_penalty": 1.0, "penalty_last_n": 8, "min_p": 0.1}},
    {"seed": 16},  # no options: vLLM's own invariance, for comparison
]
KINDS = {  # weight of each kind in the mix
    "plain": 3, "penalties": 2, "bias": 2, "min_p": 2, "schema": 4, "regex": 2,
    "probe": 2, "bad": 2, "disconnect": 1,
}  # fmt: skip


# --------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    stats_path: pathlib.Path
    log_path: pathlib.Path

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_server(
    model: str,
    workdir: pathlib.Path,
    kv_blocks: int,
    max_num_seqs: int,
    extra_args: tuple[str, ...] = (),
    max_model_len: int = 512,
) -> Server:
    port = free_port()
    stats_path = workdir / "engine_stats.json"
    log_path = workdir / "server.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        "CONSTRAINED_STATS_PATH": str(stats_path),
        "CONSTRAINED_STATS_INTERVAL_S": "0",
    }
    cmd = [
        sys.executable, "-m", "constrained", "serve", "--model", model,
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager", "--generation-config", "vllm",
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
        "--num-gpu-blocks-override", str(kv_blocks), "--seed", "0", *extra_args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(proc, f"http://127.0.0.1:{port}", stats_path, log_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(server.base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            time.sleep(1)
    server.stop()
    raise RuntimeError(f"server not healthy in 300 s:\n{log_path.read_text()[-3000:]}")


def process_rss_mb(root_pid: int) -> dict[str, float]:
    """Resident memory of the server process and each of its descendants, by command name."""
    out: dict[str, float] = {}
    pids = [root_pid]
    seen: set[int] = set()
    while pids:
        pid = pids.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
            children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        name = re.search(r"^Name:\s*(\S+)", status, re.M)
        rss = re.search(r"^VmRSS:\s*(\d+)", status, re.M)
        if rss:
            key = f"{name.group(1) if name else '?'}[{pid}]"
            out[key] = round(int(rss.group(1)) / 1024, 1)
        pids.extend(int(c) for c in children)
    return out


def preemptions(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        # The counter, not its ``_created`` timestamp.
        if line.startswith("vllm:num_preemptions") and "_created" not in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# --------------------------------------------------------------------------- requests


@dataclass
class Request:
    kind: str
    body: dict[str, Any]
    stream: bool
    expect: Any = None  # schema dict, regex, bad case or probe index


def load_schemas(count: int, seed: int, tokenizer_dir: str) -> list[dict]:
    """``count`` MaskBench schemas that ``auto`` admits (compiled here, as the server would)."""
    from constrained.grammars import GrammarError, GrammarSpec, compile_now, load_vocab
    from constrained.schema.user_input import schema_text

    files = sorted(MASKBENCH.glob("*.json")) if MASKBENCH.is_dir() else []
    random.Random(seed).shuffle(files)
    vocab = load_vocab(tokenizer_dir, 151_936)
    chosen: list[dict] = []
    for path in files:
        if len(chosen) >= count:
            break
        schema = json.loads(path.read_text())["schema"]
        text = json.dumps(schema)
        if len(text) > 20_000:
            continue
        try:
            compile_now(GrammarSpec("json_schema", schema_text(text), "auto"), vocab)
        except (GrammarError, ValueError):
            continue
        chosen.append(schema)
    return chosen + SMALL_SCHEMAS


def make_request(kind: str, rng: random.Random, schemas: list[dict], bad_cases: list) -> Request:
    prompt = rng.choice(PROMPTS)
    stream = rng.random() < 0.5
    body: dict[str, Any] = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": rng.randint(8, 48),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
    }
    if rng.random() < 0.5:
        body["seed"] = rng.randint(0, 10_000)
    expect: Any = None
    if kind == "penalties":
        body["vllm_xargs"] = {
            "repetition_penalty": round(rng.uniform(1.0, 2.0), 2),
            "frequency_penalty": round(rng.uniform(-1, 1), 2),
            "presence_penalty": round(rng.uniform(-1, 1), 2),
            "penalty_last_n": rng.choice([0, 4, 16]),
        }
    elif kind == "bias":
        ids = rng.sample(range(150_000), 4)
        body["vllm_xargs"] = {"logit_bias": json.dumps({i: rng.uniform(-5, 5) for i in ids})}
    elif kind == "min_p":
        body["vllm_xargs"] = {"min_p": round(rng.uniform(0.0, 0.5), 3)}
    elif kind == "schema":
        expect = rng.choice(schemas)
        body["vllm_xargs"] = {"json_schema": json.dumps(expect)}
        body["max_tokens"] = 160
        body["temperature"] = 1.0
    elif kind == "regex":
        expect = rng.choice(REGEXES)
        body["vllm_xargs"] = {"regex": expect}
        body["max_tokens"] = 40
    elif kind == "probe":
        index = rng.randrange(len(PROBES))
        return Request(kind, probe_body(index), stream, index)
    elif kind == "bad":
        expect = rng.choice(bad_cases)
        body["temperature"] = 1.0  # greedy resets vLLM's own min_p: no twin left to refuse
        body["vllm_xargs"] = expect.xargs
        for key, value in expect.builtin.items():
            body[key] = {"json": value} if key == "structured_outputs" else value
    elif kind == "disconnect":
        stream = True
        body["max_tokens"] = 200
        body["ignore_eos"] = True
    return Request(kind, body, stream, expect)


def probe_body(index: int) -> dict[str, Any]:
    probe = PROBES[index]
    body: dict[str, Any] = {
        "model": "tiny",
        "prompt": "Probe: ",
        "max_tokens": 24,
        "temperature": 1.0,
        "seed": probe["seed"],
        "ignore_eos": "regex" not in probe.get("vllm_xargs", {})
        and "json_schema" not in probe.get("vllm_xargs", {}),
    }
    if "vllm_xargs" in probe:
        body["vllm_xargs"] = probe["vllm_xargs"]
    return body


async def send(client: httpx.AsyncClient, req: Request) -> dict[str, Any]:
    """Send one request; ``{"status", "text", "finish", "error"}``."""
    url = "/v1/completions"
    payload = json.dumps({**req.body, "stream": req.stream})  # NaN/Infinity allowed
    headers = {"content-type": "application/json"}
    if not req.stream:
        resp = await client.post(url, content=payload, headers=headers)
        if resp.status_code != 200:
            return {"status": resp.status_code, "error": resp.text[:300]}
        choice = resp.json()["choices"][0]
        return {"status": 200, "text": choice["text"], "finish": choice["finish_reason"]}
    text, finish, chunks = [], None, 0
    async with client.stream("POST", url, content=payload, headers=headers) as resp:
        if resp.status_code != 200:
            return {"status": resp.status_code, "error": (await resp.aread()).decode()[:300]}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:  # an error after the stream began (HTTP 200 already sent)
                code = data["error"].get("code") if isinstance(data["error"], dict) else None
                return {"status": code or 500, "error": json.dumps(data)[:300], "in_stream": True}
            choice = data["choices"][0]
            text.append(choice.get("text") or "")
            finish = choice.get("finish_reason") or finish
            chunks += 1
            if req.kind == "disconnect" and chunks >= 3:
                return {"status": 200, "text": "".join(text), "finish": "disconnected"}
    return {"status": 200, "text": "".join(text), "finish": finish}


# --------------------------------------------------------------------------- checks


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(message)
        self.counts["failures"] += 1


def judge(req: Request, result: dict[str, Any], reference: dict[int, str], tally: Tally) -> None:
    from tests.output_checks import check_output

    tally.counts[f"{req.kind}:sent"] += 1
    status = result["status"]
    if req.kind == "bad":
        if status == 400 and f"'{req.expect.field}'" in result.get("error", ""):
            tally.counts["bad:refused_naming_field"] += 1
            if result.get("in_stream"):
                tally.counts["bad:refused_in_stream_event"] += 1
        else:
            tally.fail(f"bad {req.expect.id}: status {status} {result.get('error', '')[:200]}")
        return
    if status != 200:
        tally.counts["good:errors"] += 1
        tally.fail(f"{req.kind}: HTTP {status} {result.get('error', '')[:200]}")
        return
    tally.counts["good:ok"] += 1
    finish = result["finish"]
    tally.counts[f"{req.kind}:finish_{finish}"] += 1
    if req.kind == "schema" and finish == "stop":
        verdict, detail = check_output(result["text"], req.expect)
        tally.counts[f"schema:{verdict}"] += 1
        if verdict not in ("valid", "validator_error"):
            tally.fail(f"schema output {verdict}: {detail} text={result['text'][:200]!r}")
    elif req.kind == "regex" and finish == "stop":
        if re.fullmatch(req.expect, result["text"]):
            tally.counts["regex:valid"] += 1
        else:
            tally.fail(f"regex {req.expect!r} not matched by {result['text']!r}")
    elif req.kind == "probe":
        if result["text"] == reference[req.expect]:
            tally.counts["probe:equal"] += 1
        else:
            tally.counts[f"probe{req.expect}:differs"] += 1
            tally.fail(
                f"probe {req.expect} ({PROBES[req.expect]}) under load gave "
                f"{result['text']!r}, alone {reference[req.expect]!r}"
            )


async def run_round(
    base: str, seconds: float, concurrency: int, rng: random.Random, schemas: list[dict],
    bad_cases: list, reference: dict[int, str], tally: Tally,
) -> None:  # fmt: skip
    kinds, weights = zip(*KINDS.items(), strict=True)
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency + 8)
    timeout = httpx.Timeout(300.0)

    async def client_loop(seed: int) -> None:
        local = random.Random(seed)
        async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:
            while time.monotonic() < deadline:
                kind = local.choices(kinds, weights)[0]
                req = make_request(kind, local, schemas, bad_cases)
                try:
                    result = await send(client, req)
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    result = {"status": -1, "error": f"{type(exc).__name__}: {exc}"}
                judge(req, result, reference, tally)

    await asyncio.gather(*(client_loop(rng.randrange(2**31)) for _ in range(concurrency)))


async def warm_up(base: str, schemas: list[dict], tally: Tally) -> int:
    """Send each constraint of the mix once (every schema, every regex), all at once.

    Both processes compile a constraint the first time they see one and keep it (the API
    server at admission, the engine worker when the row joins: bounded caches). A 20-s round
    sees only part of the mix, so without this the next round's new constraints would read as
    growth; with it, round 1's memory is the warm baseline the later rounds are held to.
    The outputs are judged like any other. Returns the requests sent.
    """
    rng = random.Random(0)
    reqs = []
    for schema in schemas:
        req = make_request("schema", rng, [schema], [])
        reqs.append(dataclasses.replace(req, stream=False))
    for regex in REGEXES:
        req = make_request("regex", rng, [], [])
        req.body["vllm_xargs"] = {"regex": regex}
        reqs.append(dataclasses.replace(req, stream=False, expect=regex))
    limits = httpx.Limits(max_connections=len(reqs) + 8)
    async with httpx.AsyncClient(base_url=base, timeout=300.0, limits=limits) as client:
        results = await asyncio.gather(*(send(client, req) for req in reqs))
    for req, result in zip(reqs, results, strict=True):
        judge(req, result, {}, tally)
    return len(reqs)


def alone(base: str, index: int) -> str:
    resp = httpx.post(base + "/v1/completions", json=probe_body(index), timeout=120)
    resp.raise_for_status()
    return resp.json()["choices"][0]["text"]


def engine_snapshot(server: Server) -> dict[str, Any]:
    # A plain request makes the engine step, so rows finished or aborted are retired (the
    # processors hear of removals in the next step's batch update).
    for _ in range(2):
        httpx.post(server.base + "/v1/completions",
                   json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=120)  # fmt: skip
    time.sleep(0.5)
    return json.loads(server.stats_path.read_text())


def check_snapshot(snapshot: dict[str, Any], tally: Tally, label: str) -> None:
    for name, proc in snapshot["processors"].items():
        if proc["active_slots"] or proc["payloads"]:
            tally.fail(f"{label}: {name} still holds {proc} with no request of ours running")
    cache = snapshot["compile_cache"]
    if cache["entries"] > cache["capacity"]:
        tally.fail(f"{label}: compile cache {cache['entries']} > bound {cache['capacity']}")


# --------------------------------------------------------------------------- main


def run(args: argparse.Namespace, server: Server | None = None) -> dict[str, Any]:
    """The soak on ``server`` (left running), or on a server of its own (stopped after)."""
    from constrained.tiny_model import build_tiny_model
    from tests.bad_requests import CORPUS

    model = args.model or str(build_tiny_model())
    rng = random.Random(args.seed)
    schemas = load_schemas(args.schemas, args.seed, model)
    # A 5 MB body per bad request would dominate the load; tests/test_bad_requests.py sends it.
    bad_cases = [c for c in CORPUS if c.id != "schema-5MB"]
    own_server = server is None
    if server is None:
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="constrained-soak-"))
        server = start_server(model, workdir, args.kv_blocks, args.max_num_seqs)
    tally = Tally()
    rounds: list[dict[str, Any]] = []
    began = time.monotonic()
    try:
        reference = {i: alone(server.base, i) for i in range(len(PROBES))}
        again = {i: alone(server.base, i) for i in range(len(PROBES))}
        if again != reference:
            tally.fail(f"probes differ between two runs alone: {reference} vs {again}")
        warm_counts, warm_began = Counter(tally.counts), time.monotonic()
        warm_sent = asyncio.run(warm_up(server.base, schemas, tally))
        warm_counts, warm_s = tally.counts - warm_counts, time.monotonic() - warm_began
        for number in range(1, args.rounds + 1):
            before = preemptions(server.base)
            counts_before = Counter(tally.counts)
            started = time.monotonic()
            asyncio.run(
                run_round(server.base, args.round_s, args.concurrency, rng, schemas,
                          bad_cases, reference, tally)
            )  # fmt: skip
            snapshot = engine_snapshot(server)
            check_snapshot(snapshot, tally, f"round {number}")
            counts = tally.counts - counts_before
            rounds.append(
                {
                    "round": number,
                    "seconds": round(time.monotonic() - started, 1),
                    "requests": sum(v for k, v in counts.items() if k.endswith(":sent")),
                    "counts": dict(sorted(counts.items())),
                    "preemptions": preemptions(server.base) - before,
                    "engine_snapshot": snapshot,
                    "rss_mb": process_rss_mb(server.proc.pid),
                }
            )
            print(json.dumps({k: rounds[-1][k] for k in ("round", "requests", "preemptions")}
                             | {"rss_mb": rounds[-1]["rss_mb"]}), flush=True)  # fmt: skip
        check_memory(rounds, args.rss_slack_mb, tally)
        health = httpx.get(server.base + "/health", timeout=30).status_code
        if health != 200:
            tally.fail(f"/health answered {health} at the end")
    finally:
        if own_server:
            server.stop()
    totals = Counter()
    for r in rounds:
        totals.update(r["counts"])
    return {
        "command": "python -m benchmarks.soak " + " ".join(args.argv),
        "settings": {k: v for k, v in vars(args).items() if k != "argv"},
        "wall_s": round(time.monotonic() - began, 1),
        "schemas": len(schemas),
        "warm_up": {
            "requests": warm_sent,
            "seconds": round(warm_s, 1),
            "counts": dict(sorted(warm_counts.items())),
        },
        "probes_alone": reference,
        "totals": dict(sorted(totals.items())),
        "requests": sum(v for k, v in totals.items() if k.endswith(":sent")),
        "preemptions": sum(r["preemptions"] for r in rounds),
        "rounds": rounds,
        "failures": tally.failures,
        "failure_count": tally.counts["failures"],
    }


def check_memory(rounds: list[dict[str, Any]], slack_mb: float, tally: Tally) -> None:
    """Each process's memory after the first round stays within ``slack_mb`` of round 1's."""
    if len(rounds) < 2:
        return
    first = rounds[0]["rss_mb"]
    for later in rounds[1:]:
        for proc, mb in later["rss_mb"].items():
            if proc in first and mb - first[proc] > slack_mb:
                tally.fail(
                    f"round {later['round']}: {proc} at {mb} MB, round 1 {first[proc]} MB "
                    f"(+{mb - first[proc]:.0f} > {slack_mb} MB)"
                )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-s", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--kv-blocks", type=int, default=24,
                        help="KV cache blocks (vLLM --num-gpu-blocks-override); small forces "
                        "preemption")  # fmt: skip
    parser.add_argument("--schemas", type=int, default=40, help="MaskBench schemas in the mix")
    parser.add_argument("--rss-slack-mb", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="model directory (default: the embedded tiny model)")
    parser.add_argument("--out", type=pathlib.Path, help="write the report JSON here")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args
