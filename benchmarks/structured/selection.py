"""The ``_select`` child: which MaskBench schemas ``throughput`` uses.

MaskBench shuffled with a seed; a schema is kept when vLLM's xgrammar backend accepts it (its
admission check, then a compile with the engine's settings) and so does our admission (option
parsing and the compile) under each of our configurations being compared. No engine: the
tokenizer, our vocabulary and both compilers are built in this process.
"""

from __future__ import annotations

import pathlib
import random
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from benchmarks.structured.configs import OURS_EXTRA, set_engine_env
from benchmarks.structured.outcomes import first_words
from benchmarks.structured.schemas import load_schema, schema_text, split_of

WIDTH = 151_936  # the tiny Qwen2 model's logits width (vLLM's vocab_size for xgrammar)


def _with_timeout(pool: ThreadPoolExecutor, fn: Callable[[], Any], timeout: float) -> Any:
    return pool.submit(fn).result(timeout=timeout)


def run_select(
    maskbench: pathlib.Path, count: int, seed: int, timeout: float, ours: list[str]
) -> dict[str, Any]:
    """Shuffle MaskBench with ``seed``; keep the first ``count`` schemas both sides accept.

    ``ours``: the configurations of ours (keys of ``OURS_EXTRA``) that must all admit.
    A compile over ``timeout`` seconds counts as a refusal; it may go on in a worker thread,
    so the caller leaves with ``os._exit``.
    """
    set_engine_env()
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    from constrained.admission import spec_of
    from constrained.grammars import load_vocab
    from constrained.grammars.compiler import compiler_for, describe
    from constrained.request_options import options_from_params
    from constrained.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    vocab = load_vocab(model, WIDTH)
    compiler = compiler_for(vocab)
    tokenizer = AutoTokenizer.from_pretrained(model)
    xgr_compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=WIDTH), max_threads=2
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
                spec = spec_of(options_from_params(params, logits_width=WIDTH))
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
