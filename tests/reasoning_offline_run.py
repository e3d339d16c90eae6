"""Offline, on the tiny ``qwen3.6`` model with vLLM's ``qwen3`` reasoning parser
(``LLM(reasoning_parser="qwen3")``): constrained chat requests that give no
``reasoning_end`` (the parser's ``</think>`` is the default), with thinking on and off, and a
tool call as a ``structural_tag``. The four chat prompts are rendered with the model's chat
template (as ``llm.chat`` renders them, ``enable_thinking`` per case) and run as one batch.
Prints each output's token ids.

A subprocess of ``test_reasoning_engine.py``: this engine never shares a process with the
session's, runs while that one is idle, and exits before the test returns.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    import constrained
    from constrained.demo import engine_kwargs

    model, schema, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = LLM(model=model, logits_processors=constrained.LOGITS_PROCESSORS,
              reasoning_parser="qwen3", **engine_kwargs())  # fmt: skip
    messages = [{"role": "user", "content": "A person, as JSON"}]
    cases = (
        ("thinking", {"json_schema": schema}, True),
        ("budget", {"json_schema": schema, "max_reasoning_tokens": 6}, True),
        ("no_thinking", {"json_schema": schema}, False),
        ("tool_call", {"structural_tag": tag}, True),
    )
    # One batch: each case's chat prompt rendered as ``llm.chat`` renders it (the model's
    # template, thinking on or off), then one ``generate`` (four ``chat`` calls in a row
    # cost four times the steps).
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                      enable_thinking=thinking)
        for _, _, thinking in cases
    ]  # fmt: skip
    params = [
        SamplingParams(temperature=1.0, seed=3, max_tokens=120, extra_args=extra)
        for _, extra, _ in cases
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    results = {
        name: list(out.outputs[0].token_ids)
        for (name, _, _), out in zip(cases, outputs, strict=True)
    }
    print("RESULT " + json.dumps(results))
