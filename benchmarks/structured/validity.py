"""The ``validity`` subcommand: how many of our outputs are valid, split by split.

One engine with our processors. A stratified MaskBench sample, each schema submitted alone
first (the real admission: a refused schema raises at ``generate``), then every admitted one
in one batched ``generate`` call; every output that finishes with ``stop`` is judged with
``jsonschema``. Optionally biases the tokens that close JSON strings, objects and arrays
(``--close-bias``) so more outputs finish. Writes ``generation_validity.json`` (or
``generation_validity_biased.json``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

from benchmarks.common import machine_info
from benchmarks.structured.configs import SEED_BASE, TEMPERATURE, set_engine_env
from benchmarks.structured.outcomes import VALIDATOR, check_output, first_words, format_checks
from benchmarks.structured.report import print_validity, validity_summary, write_json
from benchmarks.structured.schemas import (
    SPLITS,
    load_schema,
    prompt_for,
    sample_splits,
    schema_text,
    split_of,
)

# Texts that close JSON strings, objects and arrays: those that are single tokens get the bias.
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
    """The ``validity`` subcommand."""
    set_engine_env()
    from vllm import LLM, SamplingParams

    import constrained
    from constrained.admission import tokenizer_path
    from constrained.demo import engine_kwargs
    from constrained.grammars import load_vocab
    from constrained.grammars.compiler import compiler_for, describe
    from constrained.grammars.spec import GrammarSpec
    from constrained.tiny_model import build_tiny_model

    files = sample_splits(args.maskbench, args.per_split, args.seed)
    model = str(build_tiny_model())
    kwargs = {**engine_kwargs(), "logits_processors": constrained.LOGITS_PROCESSORS}
    llm = LLM(model=model, **kwargs)
    model_config = llm.llm_engine.model_config
    vocab = load_vocab(tokenizer_path(model_config), int(model_config.get_vocab_size()))
    compiler = compiler_for(vocab)
    extra: dict[str, Any] = {"grammar_backend": args.backend}
    bias = closing_bias(llm.get_tokenizer(), args.close_bias) if args.close_bias else {}
    if bias:
        extra["logit_bias"] = bias

    def params(text: str, i: int, max_tokens: int) -> SamplingParams:
        """Request ``i`` of ``files``, constrained to its schema ``text``."""
        return SamplingParams(
            temperature=TEMPERATURE,
            seed=SEED_BASE + i,
            max_tokens=max_tokens,
            extra_args={"json_schema": text, **extra},
        )

    records: list[dict[str, Any]] = []
    admitted: list[int] = []
    for i, name in enumerate(files):
        text = schema_text(load_schema(args.maskbench, name))
        rec: dict[str, Any] = {"file": name, "split": split_of(name)}
        probe = params(text, i, 1)
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
    batch = [
        params(schema_text(load_schema(args.maskbench, files[i])), i, args.max_tokens)
        for i in admitted
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, batch, use_tqdm=False) if prompts else []
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
            "temperature": TEMPERATURE,
            "grammar_backend": args.backend,
            "close_bias": args.close_bias,
            "logit_bias": {str(k): v for k, v in bias.items()},
            "whitespace": "compact (default)",
            "engine_kwargs": kwargs,
            "maskbench": str(args.maskbench),
            "prompt": prompt_for("NAME.json"),
            "validator": VALIDATOR,
            "format_checks": format_checks(),
        },
        "generate_seconds": generate_s,
        "totals": validity_summary(records),
        "splits": [
            {"split": split, **validity_summary([r for r in records if r["split"] == split])}
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
    write_json(path, report)
    print_validity(report)
    print(f"wrote {path}")
    return 0
