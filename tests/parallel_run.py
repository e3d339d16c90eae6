"""Run one mixed batch on a parallel engine layout; print what every request and rank saw.

Used by ``tests/test_parallel.py`` as a subprocess (one engine at a time, each in its own
process tree) and by hand::

    python -m tests.parallel_run MODEL_DIR --tp 2 --out result.json

Each layout runs the same requests twice, in one engine: once with our options and once with
none (the same vLLM parameters), so a test can tell a difference our processors make from one
vLLM makes on its own when the layout changes its arithmetic. ``--no-plain`` runs only the
first: a test that requires the single worker's tokens outright needs no such excuse.

Every rank that samples also records a digest of the logits our processors hand on, step by
step (``StepDigest`` below, registered after them): tensor-parallel ranks must agree exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vllm.v1.sample.logits_processor.interface import LogitsProcessor

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{3,8}(-[0-9]{2,4}){1,3}"

# One request per kind of per-row state we keep, sampled and greedy, and plain requests.
OPTION_KINDS: list[tuple[str, dict[str, Any] | None]] = [
    ("json_schema", {"json_schema": SCHEMA}),
    ("regex", {"regex": REGEX}),
    ("penalties_window", {"repetition_penalty": 1.3, "frequency_penalty": 0.5,
                          "presence_penalty": 0.4, "penalty_last_n": 16}),
    ("bias_min_p", {"logit_bias": {"11": 4.0, "13": 3.0, "220": 3.0}, "min_p": 0.02}),
    ("dry", {"dry_multiplier": 0.8, "dry_allowed_length": 2}),
    ("ngram", {"no_repeat_ngram_size": 3}),
    ("xtc_sigma", {"xtc_probability": 0.5, "xtc_threshold": 0.0001, "top_n_sigma": 2.0}),
    ("plain", None),
]  # fmt: skip
# With ``--reasoning``: think first (the marker forced after 8 tokens), then the JSON schema.
REASONING_KIND = ("reasoning_json", {"json_schema": SCHEMA, "reasoning_end": "</think>",
                                     "max_reasoning_tokens": 8})  # fmt: skip
# A bad option the engine must refuse, naming it (``--ray`` runs check it).
BAD_OPTION = {"dry_multiplier": -1.0}


def requests(
    prompt_words: int, max_tokens: int, copies: int = 1, reasoning: bool = False
) -> list[dict[str, Any]]:
    """Two requests per kind (one seeded at temperature 1, one greedy), ``copies`` times
    (other seeds and prompts), with long prompts so a small KV cache forces preemption once
    requests grow past their first block."""
    out = []
    kinds = [*OPTION_KINDS, REASONING_KIND] if reasoning else OPTION_KINDS
    for copy in range(copies):
        for i, (kind, options) in enumerate(kinds):
            for greedy in (False, True):
                words = " ".join(f"w{(i * 7 + j + copy) % 50}" for j in range(prompt_words))
                params: dict[str, Any] = dict(max_tokens=max_tokens, ignore_eos=options is None)
                if greedy:
                    params.update(temperature=0.0)
                else:
                    params.update(temperature=1.0, seed=i + 100 * copy)
                out.append({"kind": kind, "prompt": f"{kind}: {words}", "params": params,
                            "options": options})  # fmt: skip
    return out


# When this step's first processor (``StartClock``) ran, in this worker process.
_STEP_START = [0.0]


def _current_run() -> str:
    """Which of the runner's two runs (``options`` / ``plain``) is going on."""
    try:
        return (pathlib.Path(os.environ["PARALLEL_DIGEST_DIR"]) / "run").read_text()
    except OSError:
        return ""


def _start_run(label: str) -> None:
    (pathlib.Path(os.environ["PARALLEL_DIGEST_DIR"]) / "run").write_text(label)


class StartClock(LogitsProcessor):
    """A test-only V1 processor registered first: notes when our processors start a step."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        pass

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        pass

    def apply(self, logits: Any) -> Any:
        _STEP_START[0] = time.perf_counter()
        return logits


class StepDigest(LogitsProcessor):
    """A test-only V1 processor registered last: hashes the logits it is handed each step.

    It changes nothing. Each process appends one line per ``apply`` to ``digests-<pid>.jsonl``
    in ``$PARALLEL_DIGEST_DIR``: the worker's place (``placement.py``), the stage, the step,
    the digest, and (for this class) the milliseconds our processors took since
    ``StartClock``. vLLM applies processors in two groups: this one sees the logits after our
    processors that run before temperature; ``SampledDigest`` those after min-p.
    """

    STAGE = "before_temperature"

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        from constrained.processors.placement import placement_of

        self.out = pathlib.Path(os.environ["PARALLEL_DIGEST_DIR"]) / f"digests-{os.getpid()}.jsonl"
        self.worker = placement_of(vllm_config).tag or "single"
        self.node = _ray_node()
        self.step = 0

    def is_argmax_invariant(self) -> bool:
        return False  # so it runs for greedy rows too

    def update_state(self, batch_update: Any) -> None:
        pass

    def apply(self, logits: Any) -> Any:
        ms = (
            (time.perf_counter() - _STEP_START[0]) * 1e3
            if self.STAGE == "before_temperature"
            else None
        )
        sha = None
        if os.environ.get("PARALLEL_DIGEST_HASH", "1") == "1":  # benchmarks time, not hash
            sha = hashlib.blake2b(logits.cpu().numpy().tobytes(), digest_size=16).hexdigest()
        line = {"worker": self.worker, "stage": self.STAGE, "step": self.step, "sha": sha,
                "ms": ms, "rows": int(logits.shape[0]), "run": _current_run(),
                "node": self.node}  # fmt: skip
        with open(self.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        self.step += 1
        return logits


def _ray_node() -> str | None:
    """The Ray node this worker runs on (``None`` outside Ray)."""
    if "ray" not in sys.modules:
        return None
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class SampledDigest(StepDigest):
    """``StepDigest`` in vLLM's second group (argmax-invariant: after temperature and min-p;
    not run for an all-greedy batch)."""

    STAGE = "after_min_p"

    def is_argmax_invariant(self) -> bool:
        return True


HEAD_PROCESSORS = ["tests.parallel_run:StartClock"]
TAIL_PROCESSORS = ["tests.parallel_run:StepDigest", "tests.parallel_run:SampledDigest"]


def all_processors() -> list[str]:
    """Ours between the clock and the digests (the launcher keeps a given order)."""
    import constrained

    return [*HEAD_PROCESSORS, *constrained.LOGITS_PROCESSORS, *TAIL_PROCESSORS]


def run_engine(args: argparse.Namespace, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """Build one engine for this layout and run the batch with and without our options."""
    from vllm import LLM, SamplingParams

    from constrained.demo import engine_kwargs

    kwargs = engine_kwargs()
    kwargs.update(
        tensor_parallel_size=args.tp,
        pipeline_parallel_size=args.pp,
        num_gpu_blocks_override=args.kv_blocks,
        disable_log_stats=False,
    )
    if args.compiled:
        kwargs["enforce_eager"] = False
    # Under Ray, ours come from the package's entry points, as a user's engine loads them
    # (vLLM applies entry-point processors before these test-only digests).
    processors = TAIL_PROCESSORS if args.ray else all_processors()
    if args.ray:
        kwargs["distributed_executor_backend"] = "ray"
    began = time.perf_counter()
    llm = LLM(model=args.model, logits_processors=processors, **kwargs)
    result: dict[str, Any] = {"engine_start_seconds": time.perf_counter() - began}
    if args.warmup:  # compile the constraints and warm the kernels before anything is timed
        _start_run("warmup")
        warm = [SamplingParams(**{**r["params"], "max_tokens": 8}, extra_args=r["options"])
                for r in reqs]  # fmt: skip
        llm.generate([r["prompt"] for r in reqs], warm, use_tqdm=False)
    for label, with_options in runs(args):
        params = [
            SamplingParams(**r["params"], extra_args=r["options"] if with_options else None)
            for r in reqs
        ]
        _start_run(label)
        began, steps = time.perf_counter(), steps_so_far()
        outputs = llm.generate([r["prompt"] for r in reqs], params, use_tqdm=False)
        result[f"{label}_seconds"] = time.perf_counter() - began
        result[f"{label}_steps"] = steps_so_far() - steps
        result[label] = [
            {"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
             "finish_reason": o.outputs[0].finish_reason}
            for o in outputs
        ]  # fmt: skip
    result["preemptions"] = sum(
        int(getattr(m, "value", 0)) for m in llm.get_metrics() if m.name == "vllm:num_preemptions"
    )
    if args.ray:
        began = time.perf_counter()
        result["refusal"] = refusal(llm, SamplingParams)
        result["after_refusal"] = after_refusal(llm, SamplingParams)
        result["refusal_seconds"] = time.perf_counter() - began
    began = time.perf_counter()
    llm.llm_engine.engine_core.shutdown()
    result["shutdown_seconds"] = time.perf_counter() - began
    return result


def runs(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """The runs of the batch, in order: its label and whether it carries our options."""
    return [("options", True)] if args.no_plain else [("options", True), ("plain", False)]


def refusal(llm: Any, sampling_params: Any) -> str:
    """The error a request with ``BAD_OPTION`` gets (the engine keeps running)."""
    try:
        llm.generate(["bad"], sampling_params(max_tokens=4, extra_args=BAD_OPTION),
                     use_tqdm=False)  # fmt: skip
    except Exception as err:  # vLLM's VLLMValidationError, as the user gets it
        return f"{type(err).__name__}: {err}"
    return "accepted"


# The request sent after the refusal: the refused option, valid, for a few tokens.
AFTER_REFUSAL = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True}


def after_refusal(llm: Any, sampling_params: Any) -> dict[str, Any]:
    """A request after the refusal, in the same engine: it must still serve."""
    (name,) = BAD_OPTION
    _start_run("after_refusal")
    (out,) = llm.generate(["after"], sampling_params(**AFTER_REFUSAL, extra_args={name: 0.8}),
                          use_tqdm=False)  # fmt: skip
    return {"token_ids": list(out.outputs[0].token_ids),
            "finish_reason": out.outputs[0].finish_reason}  # fmt: skip


def run_data_parallel(args: argparse.Namespace, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's offline data parallelism: one process (one engine) per rank, each given every
    ``dp``-th request (``examples/offline_inference/data_parallel.py``); results merged."""
    port = _free_port()
    procs, outs = [], []
    for rank in range(args.dp):
        out = pathlib.Path(args.out).with_suffix(f".dp{rank}.json")
        env = dict(os.environ, VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank),
                   VLLM_DP_SIZE=str(args.dp), VLLM_DP_MASTER_IP="127.0.0.1",
                   VLLM_DP_MASTER_PORT=str(port))  # fmt: skip
        cmd = [sys.executable, "-m", "tests.parallel_run", args.model, "--tp", str(args.tp),
               "--pp", str(args.pp), "--kv-blocks", str(args.kv_blocks),
               "--prompt-words", str(args.prompt_words), "--max-tokens", str(args.max_tokens),
               "--copies", str(args.copies),
               "--out", str(out), "--shard", f"{rank}/{args.dp}"]  # fmt: skip
        if args.compiled:
            cmd.append("--compiled")
        if args.reasoning:
            cmd.append("--reasoning")
        if args.no_plain:
            cmd.append("--no-plain")
        procs.append(subprocess.Popen(cmd, env=env))
        outs.append(out)
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"data-parallel ranks exited with {codes}")
    parts = [json.loads(o.read_text()) for o in outs]
    merged: dict[str, Any] = {"preemptions": sum(p["preemptions"] for p in parts)}
    for label, _ in runs(args):
        merged[label] = [parts[i % args.dp][label][i // args.dp] for i in range(len(reqs))]
    return merged


def run_served(args: argparse.Namespace, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """Our launcher with vLLM's ``--data-parallel-size``: one API server in front of
    ``serve_dp`` engines, which it balances requests over. Requests go in concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    port = _free_port()
    log_path = pathlib.Path(args.out).with_suffix(".server.log")
    cmd = [sys.executable, "-m", "constrained", "serve", "--model", args.model,
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
           "--dtype", "float32", "--generation-config", "vllm", "--max-model-len", "1024",
           "--max-num-seqs", "64", "--seed", "0", "--num-gpu-blocks-override",
           str(args.kv_blocks), "--data-parallel-size", str(args.serve_dp),
           "--logits-processors", *all_processors()]  # fmt: skip
    if not args.compiled:
        cmd.append("--enforce-eager")
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(server, base, log_path)

        def one(req: dict[str, Any], with_options: bool) -> dict[str, Any]:
            body = {"model": "tiny", "prompt": req["prompt"], "return_token_ids": True,
                    **req["params"]}  # fmt: skip
            if with_options and req["options"]:
                body["vllm_xargs"] = {k: json.dumps(v) if isinstance(v, dict | list) else v
                                      for k, v in req["options"].items()}  # fmt: skip
            http = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                          {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(http, timeout=600) as resp:
                choice = json.loads(resp.read())["choices"][0]
            return {"token_ids": choice["token_ids"], "text": choice["text"],
                    "finish_reason": choice["finish_reason"]}  # fmt: skip

        result: dict[str, Any] = {}
        with ThreadPoolExecutor(len(reqs)) as pool:
            if args.warmup:
                _start_run("warmup")
                warm = [{**r, "params": {**r["params"], "max_tokens": 8}} for r in reqs]
                list(pool.map(lambda r: one(r, True), warm))
            for label, with_options in runs(args):
                _start_run(label)
                began, steps = time.perf_counter(), steps_so_far()
                result[label] = list(pool.map(lambda r, w=with_options: one(r, w), reqs))
                result[f"{label}_seconds"] = time.perf_counter() - began
                result[f"{label}_steps"] = steps_so_far() - steps
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
        result["preemptions"] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vllm:num_preemptions_total")
        )
        return result
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def _wait_healthy(server: subprocess.Popen, base: str, log_path: pathlib.Path) -> None:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"server not healthy in 400 s:\n{log_path.read_text()[-3000:]}")


def steps_so_far() -> int:
    """Decoding steps so far: the most any one worker has recorded (before temperature)."""
    counts = [
        sum('"before_temperature"' in line for line in path.read_text().splitlines())
        for path in pathlib.Path(os.environ["PARALLEL_DIGEST_DIR"]).glob("digests-*.jsonl")
    ]
    return max(counts, default=0)


def worker_records(workdir: pathlib.Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per worker: per stage, the logits digests of each step (and our processors' ms per
    step), and the worker's last state snapshot."""
    digests: dict[str, Any] = {}
    for path in sorted(workdir.glob("digests-*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            stages = digests.setdefault(rec["worker"], {})
            stage = stages.setdefault(
                rec["stage"], {"sha": [], "ms": [], "rows": [], "run": [], "node": []}
            )
            for key in ("sha", "ms", "rows", "run", "node"):
                stage[key].append(rec.get(key))
    stats = {}
    for path in sorted(workdir.glob("engine_stats*.json")):
        snap = json.loads(path.read_text())
        stats[snap["worker"] or "single"] = snap
    return digests, stats


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--kv-blocks", type=int, default=10)
    parser.add_argument("--prompt-words", type=int, default=34)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--compiled", action="store_true", help="torch.compile, not eager")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel engines")
    parser.add_argument("--serve-dp", type=int, default=0,
                        help="serve over HTTP with this --data-parallel-size")  # fmt: skip
    parser.add_argument("--shard", default="0/1", help="run every N-th request from K (K/N)")
    parser.add_argument("--copies", type=int, default=1, help="the batch this many times")
    parser.add_argument("--warmup", action="store_true",
                        help="first run the batch with options for 8 tokens, untimed")  # fmt: skip
    parser.add_argument("--ray", action="store_true",
                        help="vLLM's Ray executor (RAY_ADDRESS: a running cluster); ours "
                        "from the entry points; also try BAD_OPTION")  # fmt: skip
    parser.add_argument("--no-plain", action="store_true",
                        help="run the batch with our options only, not also without")  # fmt: skip
    parser.add_argument("--reasoning", action="store_true",
                        help="add a reasoning-gate kind (REASONING_KIND) to the batch")  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    workdir = pathlib.Path(args.out).parent
    os.environ.setdefault("PARALLEL_DIGEST_DIR", str(workdir))
    os.environ.setdefault("CONSTRAINED_STATS_PATH", str(workdir / "engine_stats.json"))
    os.environ.setdefault("CONSTRAINED_STATS_INTERVAL_S", "0")
    reqs = requests(args.prompt_words, args.max_tokens, args.copies, args.reasoning)
    if args.serve_dp:
        result = run_served(args, reqs)
    elif args.dp > 1:
        result = run_data_parallel(args, reqs)
    else:
        first, every = (int(x) for x in args.shard.split("/"))
        reqs = reqs[first::every]
        result = run_engine(args, reqs)
    result["requests"] = reqs
    if args.shard == "0/1":
        result["digests"], result["stats"] = worker_records(workdir)
    pathlib.Path(args.out).write_text(json.dumps(result))
    print(f"wrote {args.out}: preemptions={result['preemptions']}", file=sys.stderr)


if __name__ == "__main__":
    main()
