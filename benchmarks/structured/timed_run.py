"""The ``_run`` child: one configuration, one engine, one round of ``throughput``.

Starts the engine of the configuration, makes a cold call (every schema compiled for the first
time, a few tokens each), then the timed call with every step timed, and judges each output
that finished with ``stop``. Returns the record the parent keeps as one run.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

from benchmarks.common import machine_info
from benchmarks.structured import script_digest
from benchmarks.structured.configs import engine_kwargs_for, request_params, set_engine_env
from benchmarks.structured.outcomes import check_output, outcome_summary
from benchmarks.structured.schemas import load_schema, prompt_for, schema_text
from benchmarks.structured.steps import step_fit, time_calls, time_steps


def run_throughput_child(
    config: str,
    files: list[str],
    maskbench: pathlib.Path,
    tokens: int,
    warmup_tokens: int,
    profile: pathlib.Path | None,
) -> dict[str, Any]:
    """Time ``config`` on the schemas ``files`` (one request each, one ``generate`` call).

    ``profile``: where to dump a cProfile of the timed call (this process only).
    """
    set_engine_env()
    from vllm import LLM

    from constrained.tiny_model import build_tiny_model

    schemas = [load_schema(maskbench, name) for name in files]
    texts = [schema_text(s) for s in schemas]
    prompts = [prompt_for(name) for name in files]
    model = str(build_tiny_model())
    kwargs = engine_kwargs_for(config)
    start = time.perf_counter()
    llm = LLM(model=model, **kwargs)
    startup_s = time.perf_counter() - start

    def params(max_tokens: int) -> list[Any]:
        return [request_params(config, t, i, max_tokens) for i, t in enumerate(texts)]

    # Cold call: every schema compiled for the first time (ours: once, at admission), a few
    # tokens each. The timed call then finds every compile cached. Its admission (the
    # frontend's ``add_request`` calls, one after another) and its steps are timed apart.
    engine = llm.llm_engine
    cold_steps = time_steps(engine)
    admissions = time_calls(engine, "add_request")
    start = time.perf_counter()
    llm.generate(prompts, params(warmup_tokens), use_tqdm=False)
    cold_s = time.perf_counter() - start
    del engine.step, engine.add_request  # back to the class's methods
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    steps = time_steps(engine)
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
        "cold_admission_s": sum(admissions),
        "cold_first_admission_s": admissions[0] if admissions else None,
        "cold_steps": len(cold_steps),
        "cold_first_steps_ms": [round(ms, 1) for ms, _ in cold_steps[:5]],
        "cold_steps_s": sum(ms for ms, _ in cold_steps) / 1e3,
        "seconds": seconds,
        "output_tokens": produced,
        "tokens_per_s": produced / seconds,
        "requests_per_s": len(files) / seconds,
        "mean_output_tokens": produced / len(files),
        "steps": len(steps),
        "step_fit": fit,
        "step_ms_at_3_4_batch": fit["ms_at"] if fit else None,
        "step_ms_and_running": [[round(ms, 3), running] for ms, running in steps],
        **outcome_summary(records),
        "machine": machine_info(),
        "outputs": records,
    }


# The one constraint a ``--restarted`` run's earlier engine served: in no MaskBench file.
PRIMING_SCHEMA = '{"type": "object", "properties": {"ok": {"type": "boolean"}}}'


def prime_store(config: str) -> dict[str, Any]:
    """The ``_prime`` child: the engine of ``config`` serves one constrained request (a schema
    none of the timed ones is), then stops, leaving its compiled-grammar store as a restarted
    server finds it: the tokenizer's record kept (ours), every timed schema still new."""
    set_engine_env()
    from vllm import LLM

    from constrained.tiny_model import build_tiny_model

    llm = LLM(model=str(build_tiny_model()), **engine_kwargs_for(config))
    llm.generate(["Reply."], [request_params(config, PRIMING_SCHEMA, 0, 8)], use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    return {"config": config, "primed": True}
