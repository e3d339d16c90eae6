"""End-to-end JSON-schema generation: ours vs vLLM's built-in, and validity across MaskBench.

Two subcommands, both on the embedded tiny Qwen2 model (random weights, so its text is noise:
the constraint alone has to make the output valid) with ``constrained.demo.engine_kwargs()``:

``throughput``
    The same MaskBench schemas and prompts (one schema per request, a batch of ``--batch``
    requests in one ``llm.generate`` call), temperature 1.0, a seed per request, in these
    configurations, each in its own child process (one engine each), alternated over
    ``--rounds`` rounds so machine noise hits all of them:

    - ``none``: no constraint (reference; plain engine, nothing registered);
    - ``ours``: ``extra_args={"json_schema": ...}`` (our processors, ``grammar_backend``
      auto, compact whitespace);
    - ``ours_strict``: the same plus ``"disable_additional_properties": True`` (objects whose
      schema is silent about extra keys get none, as xgrammar's strict mode that vLLM uses);
    - ``ours_xgrammar``: ``ours_strict`` with ``"grammar_backend": "xgrammar"``, vLLM's backend;
    - ``vllm``: vLLM's ``StructuredOutputsParams(json=...)``, engine started with
      ``structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True}``;
    - ``vllm_ws``: the same with vLLM's default whitespace (``disable_any_whitespace`` off).

    The schemas are drawn with a fixed seed from all of MaskBench, keeping those that both
    vLLM's xgrammar backend (its admission check and a compile) and our admission (option
    parsing and the compile) of each of our configurations in ``--configs`` accept. Writes
    ``e2e_structured.json`` and ``.png``.

``validity``
    A stratified sample of MaskBench (``--per-split`` schemas from each split, by file-name
    prefix), each submitted alone first (the real admission: a refused schema raises at
    ``generate``), then every admitted one generated in one batched ``generate`` call with
    ``--max-tokens``. Every output that finishes with ``stop`` is parsed and validated with
    ``jsonschema`` (the schema's own draft, default 2020-12, with its format checker).
    Writes ``generation_validity.json``.

Usage::

    python -m benchmarks.e2e_structured throughput                 # 3 rounds x 5 configs
    python -m benchmarks.e2e_structured throughput --batch 8 --tokens 16 --rounds 1 \\
        --configs none,ours,vllm --out /tmp/smoke                  # smoke test
    python -m benchmarks.e2e_structured validity                   # 15 splits x 20 schemas
    python -m benchmarks.e2e_structured validity --per-split 1 --max-tokens 64 --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from benchmarks.common import machine_info, median, str_list

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MASKBENCH = REPO_ROOT.parent / "shared" / "data" / "maskbench"
CONFIGS = ("none", "ours", "ours_strict", "ours_xgrammar", "vllm", "vllm_ws")
# extra_args of our configurations, besides the schema.
OURS_EXTRA: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours_strict": {"disable_additional_properties": True},
    # The same backend as vLLM's (auto would pick llguidance): isolates the backend's cost.
    "ours_xgrammar": {"disable_additional_properties": True, "grammar_backend": "xgrammar"},
}
SEED_BASE = 1000
# Splits of MaskBench, by file-name prefix (all BFCL_* files are one split).
SPLITS: tuple[str, ...] = (
    "Github_trivial",
    "Github_easy",
    "Github_medium",
    "Github_hard",
    "Github_ultra",
    "Glaiveai2K",
    "Kubernetes",
    "Snowplow",
    "WashingtonPost",
    "JsonSchemaStore",
    "BFCL",
    "MCPspec",
    "JME",
    "Synthesized",
    "Handwritten",
)


def script_digest() -> str:
    """sha1 of this file: each child records it, so a copy edited mid-run shows."""
    import hashlib

    return hashlib.sha1(pathlib.Path(__file__).read_bytes()).hexdigest()[:12]


def _set_env() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def split_of(name: str) -> str | None:
    for split in SPLITS:
        if name.startswith(split):
            return split
    return None


def load_schema(maskbench: pathlib.Path, name: str) -> Any:
    return json.loads((maskbench / name).read_text())["schema"]


def schema_text(schema: Any) -> str:
    """The one JSON text both sides get (vLLM would ``json.dumps`` a dict the same way)."""
    return json.dumps(schema)


def prompt_for(name: str) -> str:
    return f"Reply with one JSON value that matches the schema {name.removesuffix('.json')}.\n"


def check_output(text: str, schema: Any) -> tuple[str, str | None]:
    """``(status, detail)``: status is ``valid``, ``not_json``, ``invalid`` or ``validator_error``.

    The validator is the schema's own draft (``$schema``; 2020-12 when absent) with that
    draft's format checker (formats whose checker needs a package that is not installed pass).
    """
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import best_match

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return "not_json", f"{exc.msg} at char {exc.pos}"
    try:
        cls = validators.validator_for(schema, default=Draft202012Validator)
        error = best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception as exc:  # unresolvable $ref, unknown draft, ...
        return "validator_error", f"{type(exc).__name__}: {exc}"[:500]
    if error is None:
        return "valid", None
    path = "/".join(str(p) for p in error.absolute_path)
    return "invalid", f"{error.message[:400]} (at /{path}; keyword {error.validator})"


def first_words(message: str, count: int = 8) -> str:
    """The first words of a refusal, after ``constrained: invalid option 'FIELD': ``."""
    prefix = "constrained: invalid option '"
    if message.startswith(prefix) and "': " in message:
        message = message.split("': ", 1)[1]
    return " ".join(message.split()[:count])


def _outcome_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over per-request records with ``finish_reason`` and ``status``."""
    n = len(records)
    stop = [r for r in records if r["finish_reason"] == "stop"]
    valid = [r for r in stop if r["status"] == "valid"]
    parsed = [r for r in stop if r["status"] in ("valid", "invalid", "validator_error")]
    return {
        "requests": n,
        "finished_stop": len(stop),
        "finished_stop_share": len(stop) / n if n else None,
        "parsed_among_finished": len(parsed),
        "valid_among_finished": len(valid),
        "valid_among_finished_share": len(valid) / len(stop) if stop else None,
        "valid_all_share": len(valid) / n if n else None,
        "finish_reasons": dict(collections.Counter(r["finish_reason"] for r in records)),
        "statuses": dict(collections.Counter(r["status"] for r in records)),
    }


# ---- throughput: schema selection (child) --------------------------------------------------


def _with_timeout(pool: ThreadPoolExecutor, fn: Any, timeout: float) -> Any:
    return pool.submit(fn).result(timeout=timeout)


def run_select(
    maskbench: pathlib.Path, count: int, seed: int, timeout: float, ours: list[str]
) -> dict[str, Any]:
    """Shuffle MaskBench with ``seed``; keep the first ``count`` schemas both sides accept."""
    _set_env()
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    from constrained.grammars import load_vocab
    from constrained.grammars.compiler import compiler_for, describe
    from constrained.options import options_from_params
    from constrained.processors.grammar_mask import spec_of
    from constrained.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    width = 151_936  # the tiny Qwen2 model's logits width (vLLM's vocab_size for xgrammar)
    vocab = load_vocab(model, width)
    compiler = compiler_for(vocab)
    tokenizer = AutoTokenizer.from_pretrained(model)
    xgr_compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=width), max_threads=2
    )
    names = sorted(p.name for p in maskbench.glob("*.json"))
    random.Random(seed).shuffle(names)
    pool = ThreadPoolExecutor(2)
    chosen: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for name in names:
        if len(chosen) >= count:
            break
        text = schema_text(load_schema(maskbench, name))
        why = None
        try:  # vLLM: its admission check, then the engine's compile with its settings
            validate_xgrammar_grammar(
                SamplingParams(structured_outputs=StructuredOutputsParams(json=text))
            )
            _with_timeout(
                pool,
                lambda t=text: xgr_compiler.compile_json_schema(
                    t, any_whitespace=False, separators=(",", ":")
                ),
                timeout,
            )
        except FutureTimeout:
            why = f"vllm: xgrammar compile over {timeout:g} s"
        except Exception as exc:
            why = f"vllm: {first_words(str(exc), 12)}"
        backend = None
        for extra in (OURS_EXTRA[c] for c in ours):
            if why is not None:
                break
            try:  # ours: what validate_params does at admission (each of our configs)
                params = SamplingParams(extra_args={"json_schema": text, **extra})
                spec = spec_of(options_from_params(params, logits_width=width))
                compiled = describe(compiler.compile(spec, timeout=timeout))
                backend = backend or compiled
            except Exception as exc:
                why = f"ours: {first_words(str(exc), 12)}"
        if why is None:
            chosen.append({"file": name, "split": split_of(name), "ours_backend": backend})
        else:
            rejected.append({"file": name, "reason": why})
        print(f"select {name}: {why or 'ok'}", file=sys.stderr, flush=True)
    return {
        "seed": seed,
        "candidates_examined": len(chosen) + len(rejected),
        "chosen": chosen,
        "rejected": rejected,
    }


# ---- throughput: one configuration, one round (child) -------------------------------------


def _params(config: str, text: str | None, index: int, max_tokens: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    common = {"temperature": 1.0, "seed": SEED_BASE + index, "max_tokens": max_tokens}
    if config in OURS_EXTRA:
        return SamplingParams(**common, extra_args={"json_schema": text, **OURS_EXTRA[config]})
    if config in ("vllm", "vllm_ws"):
        return SamplingParams(**common, structured_outputs=StructuredOutputsParams(json=text))
    return SamplingParams(**common)


def _engine_kwargs(config: str) -> dict[str, Any]:
    import constrained
    from constrained.demo import engine_kwargs

    kwargs = engine_kwargs()
    if config in OURS_EXTRA:
        kwargs["logits_processors"] = constrained.LOGITS_PROCESSORS
    elif config == "vllm":
        kwargs["structured_outputs_config"] = {
            "backend": "xgrammar",
            "disable_any_whitespace": True,
        }
    elif config == "vllm_ws":
        kwargs["structured_outputs_config"] = {"backend": "xgrammar"}
    return kwargs


def run_throughput_child(
    config: str,
    files: list[str],
    maskbench: pathlib.Path,
    tokens: int,
    warmup_tokens: int,
    profile: pathlib.Path | None,
) -> dict[str, Any]:
    _set_env()
    from vllm import LLM

    from constrained.tiny_model import build_tiny_model

    schemas = [load_schema(maskbench, name) for name in files]
    texts = [schema_text(s) for s in schemas]
    prompts = [prompt_for(name) for name in files]
    model = str(build_tiny_model())
    kwargs = _engine_kwargs(config)
    start = time.perf_counter()
    llm = LLM(model=model, **kwargs)
    startup_s = time.perf_counter() - start

    def params(max_tokens: int) -> list[Any]:
        return [_params(config, t, i, max_tokens) for i, t in enumerate(texts)]

    # Cold call: every schema compiled for the first time (both processes for ours), a few
    # tokens each. The timed call then finds every compile cached.
    start = time.perf_counter()
    llm.generate(prompts, params(warmup_tokens), use_tqdm=False)
    cold_s = time.perf_counter() - start
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    engine = llm.llm_engine
    steps = _time_steps(engine)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params(tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    del engine.step  # back to the class's method
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))
    records = []
    for name, schema, out in zip(files, schemas, outputs, strict=True):
        completion = out.outputs[0]
        finish = completion.finish_reason or "none"
        status, detail = (
            check_output(completion.text, schema) if finish == "stop" else ("unfinished", None)
        )
        records.append(
            {
                "file": name,
                "finish_reason": finish,
                "output_tokens": len(completion.token_ids),
                "status": status,
                "detail": detail,
                "text_head": completion.text[:120],
            }
        )
    produced = sum(r["output_tokens"] for r in records)
    fit = step_fit(steps, 0.75 * len(files))
    return {
        "config": config,
        "script_sha1": script_digest(),
        "engine_kwargs": kwargs,
        "startup_s": startup_s,
        "cold_seconds": cold_s,
        "cold_tokens": warmup_tokens,
        "seconds": seconds,
        "output_tokens": produced,
        "tokens_per_s": produced / seconds,
        "requests_per_s": len(files) / seconds,
        "mean_output_tokens": produced / len(files),
        "steps": len(steps),
        "step_fit": fit,
        "step_ms_at_3_4_batch": fit["ms_at"] if fit else None,
        "step_ms_and_running": [[round(ms, 3), running] for ms, running in steps],
        **_outcome_summary(records),
        "machine": machine_info(),
        "outputs": records,
    }


def step_fit(steps: list[tuple[float, int]], at: float) -> dict[str, Any] | None:
    """Least-squares ``ms = intercept + slope * running`` over the decoding steps.

    Leaves out the first two steps (prefill), calls that returned before the engine produced
    anything (< 1 ms) and stalls (> 3x the median step, e.g. the first masks of new
    requests), so the fit is the per-step cost at a given occupancy, whatever the lengths.
    """
    body = [(ms, n) for ms, n in steps[2:] if ms >= 1.0]
    if len(body) < 3:
        return None
    cap = 3.0 * median([ms for ms, _ in body])
    body = [(ms, n) for ms, n in body if ms <= cap]
    xs, ys = [float(n) for _, n in body], [ms for ms, _ in body]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    intercept = my - slope * mx
    return {
        "intercept_ms": intercept,
        "ms_per_running_request": slope,
        "at_running": at,
        "ms_at": intercept + slope * at,
        "steps_used": len(body),
        "running_range": [min(xs), max(xs)],
        "stalls_left_out_ms": [round(ms, 1) for ms, _ in steps[2:] if ms > cap],
    }


def _time_steps(engine: Any) -> list[tuple[float, int]]:
    """Wrap ``engine.step`` (what ``LLM.generate`` loops on): (ms, unfinished requests) each."""
    steps: list[tuple[float, int]] = []
    original = engine.step

    def timed_step() -> Any:
        running = engine.get_num_unfinished_requests()
        start = time.perf_counter()
        result = original()
        steps.append(((time.perf_counter() - start) * 1000.0, running))
        return result

    engine.step = timed_step
    return steps


# ---- throughput: parent -------------------------------------------------------------------


def _child(args: list[str], out_key: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="e2e_structured-") as tmp:
        result = pathlib.Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.e2e_structured", *args, out_key, str(result)]
        print(f"== {' '.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False)
        if proc.returncode != 0 or not result.exists():
            return {"error": f"child exited with status {proc.returncode}"}
        return json.loads(result.read_text())


def run_throughput(args: argparse.Namespace) -> int:
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
            "temperature": 1.0,
            "seed": f"{SEED_BASE} + request index",
            "select_seed": args.seed,
            "maskbench": str(args.maskbench),
            "prompt": prompt_for("NAME.json"),
        },
    }
    selection = _child(
        [
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
        ],
        "--child-out",
    )
    report["selection"] = selection
    if "error" in selection:
        print(f"selection failed: {selection['error']}", file=sys.stderr)
        return 1
    files = [c["file"] for c in selection["chosen"]]
    tmp = tempfile.TemporaryDirectory(prefix="e2e_structured-files-")
    files_path = pathlib.Path(tmp.name) / "files.json"
    files_path.write_text(json.dumps(files))
    runs: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for config in args.configs:
                extra = []
                if args.profile_dir and config in OURS_EXTRA and round_ == 0:
                    prof = pathlib.Path(args.profile_dir) / f"e2e_structured_{config}.prof"
                    extra = ["--profile", str(prof)]
                record = _child(
                    [
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
                    ],
                    "--child-out",
                )
                record.update(config=config, round=round_)
                runs.append(record)
                if "error" not in record:
                    print(
                        f"round {round_} {config:8s}: {record['requests_per_s']:6.2f} req/s "
                        f"{record['tokens_per_s']:7.1f} tok/s  stop {record['finished_stop']}"
                        f"/{record['requests']}  valid {record['valid_among_finished']}"
                        f"  step@3/4 {record['step_ms_at_3_4_batch']:.1f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        tmp.cleanup()
    report["runs"] = runs
    report["summary"] = _throughput_summary(runs, args.configs)
    json_path = out / "e2e_structured.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    png_path = out / "e2e_structured.png"
    plot_throughput(report, png_path)
    for s in report["summary"]:
        print(
            f"{s['config']:8s} median {s['requests_per_s_median']:6.2f} req/s "
            f"{s['tokens_per_s_median']:7.1f} tok/s  stop {s['finished_stop_share_median']:.0%}"
            f"  valid/finished {s['valid_among_finished_share_min']}"
            f"  valid/all {s['valid_all_share_median']:.0%}"
            f"  step@3/4 {s['step_ms_at_3_4_batch_median']:.1f} ms"
        )
    print(f"wrote {json_path} and {png_path}")
    return 1 if any("error" in r for r in runs) else 0


def _throughput_summary(runs: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    summary = []
    for config in configs:
        ok = [r for r in runs if r["config"] == config and "error" not in r]
        if not ok:
            continue
        entry: dict[str, Any] = {"config": config, "rounds": len(ok)}
        for key in (
            "requests_per_s",
            "tokens_per_s",
            "seconds",
            "cold_seconds",
            "startup_s",
            "output_tokens",
            "mean_output_tokens",
            "step_ms_at_3_4_batch",
            "finished_stop_share",
            "valid_all_share",
        ):
            values = [r[key] for r in ok]
            known = [v for v in values if v is not None]
            entry[f"{key}_median"] = median(known) if known else None
            entry[f"{key}_all"] = values
        shares = [r["valid_among_finished_share"] for r in ok]
        entry["valid_among_finished_share_all"] = shares
        known = [s for s in shares if s is not None]
        entry["valid_among_finished_share_min"] = min(known) if known else None
        summary.append(entry)
    by = {s["config"]: s for s in summary}
    for name in OURS_EXTRA:
        if name not in by or "vllm" not in by:
            continue
        for key in ("requests_per_s", "tokens_per_s", "step_ms_at_3_4_batch"):
            ours, vllm = by[name][f"{key}_median"], by["vllm"][f"{key}_median"]
            by[name][f"{key}_over_vllm"] = ours / vllm if ours and vllm else None
    return summary


def plot_throughput(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    if not summary:
        return
    colors = {
        "none": "#9e9e9e",
        "ours": "#ff7f0e",
        "ours_strict": "#ffbb78",
        "ours_xgrammar": "#d62728",
        "vllm": "#1f77b4",
        "vllm_ws": "#aec7e8",
    }
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, key, label in (
        (axes[0], "requests_per_s", "requests/s"),
        (axes[1], "tokens_per_s", "output tokens/s"),
        (axes[2], "step_ms_at_3_4_batch", "ms per step at 3/4 batch running (fit)"),
    ):
        for i, s in enumerate(summary):
            values = [v for v in s[f"{key}_all"] if v is not None]
            if not values:
                continue
            ax.bar(i, s[f"{key}_median"], 0.6, color=colors.get(s["config"], "#777777"))
            ax.plot([i] * len(values), values, "k.", markersize=5)
            note = f"{s[f'{key}_median']:.1f}"
            if s["config"] != "none" and key != "step_ms_at_3_4_batch":
                note += f"\nvalid {s['valid_all_share_median']:.0%}"
                note += f"\nstop {s['finished_stop_share_median']:.0%}"
            ax.text(i, s[f"{key}_median"], note, ha="center", va="bottom", fontsize=8)
        top = max((v for s in summary for v in s[f"{key}_all"] if v is not None), default=1)
        ax.set_ylim(0, top * 1.3)
        ax.set_xticks(range(len(summary)), [s["config"] for s in summary])
        ax.set_ylabel(label)
    settings, machine = report["settings"], report["machine"]
    fig.suptitle(
        f"JSON schema, {settings['batch']} MaskBench schemas x {settings['tokens']} max tokens, "
        f"T=1, {settings['rounds']} rounds; {machine['cpu_model']} x{machine['cpu_cores']}, "
        f"vLLM {machine['vllm']}\nbars: median of the rounds; dots: each round",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- validity -----------------------------------------------------------------------------


def sample_splits(maskbench: pathlib.Path, per_split: int, seed: int) -> list[str]:
    by_split: dict[str, list[str]] = collections.defaultdict(list)
    for p in sorted(maskbench.glob("*.json")):
        split = split_of(p.name)
        if split is not None:
            by_split[split].append(p.name)
    rng = random.Random(seed)
    chosen = []
    for split in SPLITS:
        names = by_split.get(split, [])
        chosen.extend(sorted(rng.sample(names, min(per_split, len(names)))))
    return chosen


CLOSERS = ('"', '",', '"}', '"]', "}", "]", "},", "],", "}}", "]}", "}]")


def closing_bias(tokenizer: Any, value: float) -> dict[int, float]:
    """``{token id: value}`` for the ``CLOSERS`` that are single tokens of ``tokenizer``."""
    bias: dict[int, float] = {}
    for text in CLOSERS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1:
            bias[ids[0]] = value
    return bias


def run_validity(args: argparse.Namespace) -> int:
    _set_env()
    from vllm import LLM, SamplingParams

    import constrained
    from constrained.demo import engine_kwargs
    from constrained.grammars import load_vocab
    from constrained.grammars.compiler import compiler_for, describe
    from constrained.grammars.spec import GrammarSpec
    from constrained.processors.grammar_mask import _tokenizer_path
    from constrained.tiny_model import build_tiny_model

    files = sample_splits(args.maskbench, args.per_split, args.seed)
    model = str(build_tiny_model())
    kwargs = {**engine_kwargs(), "logits_processors": constrained.LOGITS_PROCESSORS}
    llm = LLM(model=model, **kwargs)
    model_config = llm.llm_engine.model_config
    vocab = load_vocab(_tokenizer_path(model_config), int(model_config.get_vocab_size()))
    compiler = compiler_for(vocab)
    extra: dict[str, Any] = {"grammar_backend": args.backend}
    bias = closing_bias(llm.get_tokenizer(), args.close_bias) if args.close_bias else {}
    if bias:
        extra["logit_bias"] = bias

    records: list[dict[str, Any]] = []
    admitted: list[int] = []
    for i, name in enumerate(files):
        schema = load_schema(args.maskbench, name)
        text = schema_text(schema)
        rec: dict[str, Any] = {"file": name, "split": split_of(name)}
        probe = SamplingParams(
            temperature=1.0,
            seed=SEED_BASE + i,
            max_tokens=1,
            extra_args={"json_schema": text, **extra},
        )
        start = time.perf_counter()
        try:  # the real admission, one request at a time
            llm.generate([prompt_for(name)], probe, use_tqdm=False)
        except Exception as exc:
            cause = exc.__cause__ or exc
            rec.update(
                refused=True,
                refused_by=type(cause).__name__,
                reason_first_words=first_words(str(cause)),
                reason=str(cause)[:600],
            )
        else:
            rec["refused"] = False
            admitted.append(i)
            try:  # the same process's compile cache: which backend auto picked
                spec = GrammarSpec("json_schema", text, args.backend)
                rec["backend"] = describe(compiler.compile(spec))
            except Exception as exc:  # pragma: no cover - admitted means it compiled
                rec["backend"] = f"? {exc}"
        rec["admission_s"] = time.perf_counter() - start
        records.append(rec)
        print(
            f"admit {i + 1}/{len(files)} {name}: "
            f"{'refused: ' + rec['reason_first_words'] if rec['refused'] else rec['backend']}",
            file=sys.stderr,
            flush=True,
        )

    prompts = [prompt_for(files[i]) for i in admitted]
    params = [
        SamplingParams(
            temperature=1.0,
            seed=SEED_BASE + i,
            max_tokens=args.max_tokens,
            extra_args={"json_schema": schema_text(load_schema(args.maskbench, files[i])), **extra},
        )
        for i in admitted
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
    generate_s = time.perf_counter() - start
    for i, out in zip(admitted, outputs, strict=True):
        rec = records[i]
        completion = out.outputs[0]
        finish = completion.finish_reason or "none"
        rec.update(finish_reason=finish, output_tokens=len(completion.token_ids))
        if finish == "stop":
            status, detail = check_output(completion.text, load_schema(args.maskbench, rec["file"]))
        else:
            status, detail = "unfinished", None
        rec.update(status=status, detail=detail)
        if status in ("valid", "unfinished"):
            rec["text_head"] = completion.text[:200]
        else:
            rec["text"] = completion.text
            rec["token_ids"] = list(completion.token_ids)

    report = {
        "benchmark": "generation_validity",
        "machine": machine_info(),
        "settings": {
            "per_split": args.per_split,
            "seed": args.seed,
            "request_seed": f"{SEED_BASE} + index in the file list",
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "grammar_backend": args.backend,
            "close_bias": args.close_bias,
            "logit_bias": {str(k): v for k, v in bias.items()},
            "whitespace": "compact (default)",
            "engine_kwargs": kwargs,
            "maskbench": str(args.maskbench),
            "prompt": prompt_for("NAME.json"),
            "validator": "jsonschema validator_for(schema, default=Draft202012Validator), "
            "format_checker=cls.FORMAT_CHECKER",
            "format_checks": _format_checks(),
        },
        "generate_seconds": generate_s,
        "totals": _validity_summary(records),
        "splits": [
            {"split": split, **_validity_summary([r for r in records if r["split"] == split])}
            for split in SPLITS
            if any(r["split"] == split for r in records)
        ],
        "finished_but_invalid": [
            r for r in records if r.get("finish_reason") == "stop" and r["status"] != "valid"
        ],
        "schemas": records,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("generation_validity_biased.json" if bias else "generation_validity.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    _print_validity(report)
    print(f"wrote {path}")
    return 0


def _format_checks() -> list[str]:
    from jsonschema import Draft202012Validator

    return sorted(Draft202012Validator.FORMAT_CHECKER.checkers)


def _validity_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    admitted = [r for r in records if not r["refused"]]
    summary = _outcome_summary(admitted) if admitted else {"requests": 0}
    summary.pop("requests", None)
    return {
        "submitted": len(records),
        "refused": len(records) - len(admitted),
        "refused_reasons": dict(
            collections.Counter(r["reason_first_words"] for r in records if r["refused"])
        ),
        "admitted": len(admitted),
        "backends": dict(collections.Counter(r.get("backend") for r in admitted)),
        **summary,
    }


def _print_validity(report: dict[str, Any]) -> None:
    print(f"{'split':16s} submitted refused stop valid/stop")
    for s in [*report["splits"], {"split": "TOTAL", **report["totals"]}]:
        print(
            f"{s['split']:16s} {s['submitted']:9d} {s['refused']:7d} "
            f"{s.get('finished_stop', 0):4d} {s.get('valid_among_finished', 0):5d}"
        )
    bad = report["finished_but_invalid"]
    print(f"finished with stop but not valid: {len(bad)}")
    for r in bad:
        print(
            f"  {r['file']} [{r.get('backend')}]: {r['status']}: {r['detail']}\n    {r['text']!r}"
        )


# ---- command line -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
        p.add_argument("--out", default="benchmarks/results", help="results directory")

    tp = sub.add_parser("throughput", help="ours vs vLLM's built-in structured outputs")
    common(tp)
    tp.add_argument("--batch", type=int, default=64, help="schemas = requests per generate")
    tp.add_argument("--tokens", type=int, default=128, help="max_tokens per request")
    tp.add_argument("--warmup-tokens", type=int, default=8, help="max_tokens of the cold call")
    tp.add_argument("--rounds", type=int, default=3, help="alternated rounds (median kept)")
    tp.add_argument("--configs", type=str_list, default=list(CONFIGS), help=",".join(CONFIGS))
    tp.add_argument("--seed", type=int, default=0, help="seed of the schema selection")
    tp.add_argument(
        "--compile-timeout", type=float, default=10.0, help="selection: seconds per compile"
    )
    tp.add_argument(
        "--profile-dir",
        metavar="DIR",
        help="cProfile the round-0 timed call of our configs (frontend process only: admission "
        "and output handling; the processors run in the engine's worker) into DIR/*.prof",
    )

    va = sub.add_parser("validity", help="validity of our outputs across MaskBench splits")
    common(va)
    va.add_argument("--per-split", type=int, default=20, help="schemas drawn per split")
    va.add_argument("--max-tokens", type=int, default=512)
    va.add_argument(
        "--close-bias",
        type=float,
        default=0.0,
        help="add this logit_bias (ours) to single tokens that close JSON strings, objects "
        "and arrays, so more outputs finish (writes generation_validity_biased.json)",
    )
    va.add_argument("--seed", type=int, default=0, help="seed of the per-split sample")
    va.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "llguidance", "xgrammar", "outlines"],
        help="grammar_backend",
    )

    sel = sub.add_parser("_select", help=argparse.SUPPRESS)
    sel.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    sel.add_argument("--batch", type=int, required=True)
    sel.add_argument("--seed", type=int, required=True)
    sel.add_argument("--compile-timeout", type=float, required=True)
    sel.add_argument("--child-out", required=True)
    sel.add_argument("--ours", type=str_list, default=["ours"], help="our configs that must admit")

    run = sub.add_parser("_run", help=argparse.SUPPRESS)
    run.add_argument("config", choices=CONFIGS)
    run.add_argument("--files", required=True)
    run.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    run.add_argument("--tokens", type=int, required=True)
    run.add_argument("--warmup-tokens", type=int, required=True)
    run.add_argument("--profile", type=pathlib.Path)
    run.add_argument("--child-out", required=True)

    args = parser.parse_args(argv)
    if args.command == "throughput":
        unknown = [c for c in args.configs if c not in CONFIGS]
        if unknown:
            parser.error(f"unknown config(s) {unknown}; choose from {list(CONFIGS)}")
        if args.batch > 64:
            parser.error("--batch must be <= max_num_seqs = 64 (constrained.demo.engine_kwargs)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "_select":
        record = run_select(args.maskbench, args.batch, args.seed, args.compile_timeout, args.ours)
        pathlib.Path(args.child_out).write_text(json.dumps(record, indent=2) + "\n")
        sys.stdout.flush()
        os._exit(0)  # a compile that timed out may still run in a worker thread
    if args.command == "_run":
        files = json.loads(pathlib.Path(args.files).read_text())
        record = run_throughput_child(
            args.config, files, args.maskbench, args.tokens, args.warmup_tokens, args.profile
        )
        pathlib.Path(args.child_out).write_text(json.dumps(record, indent=2) + "\n")
        return 0
    if args.command == "throughput":
        return run_throughput(args)
    return run_validity(args)


if __name__ == "__main__":
    sys.exit(main())
