"""Think first, then answer constrained, on the real vLLM engine (V1, CPU build) and server.

The session's tiny Qwen2 model spells ``</think>`` in several tokens (Qwen3's vocabulary has it
as one special token): the gate matches the marker's tokens either way. Its random weights
never end thinking on their own, so ``max_reasoning_tokens`` (or the budget) forces the marker.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from tests.test_budget_closing import PERSON

MARKER = "</think>"


def think_then_answer(text: str) -> tuple[str, dict]:
    thinking, sep, answer = text.partition(MARKER)
    assert sep, f"no marker in {text!r}"
    return thinking, json.loads(answer)


@pytest.mark.parametrize("think", [0, 7, None])
def test_thinks_then_answers_valid_json(llm, think):
    extra = {"json_schema": PERSON, "reasoning_end": MARKER}
    if think is not None:
        extra["max_reasoning_tokens"] = think
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=200, extra_args=extra)
        out = llm.generate(["Think, then answer in JSON:"], params, use_tqdm=False)[0].outputs[0]
        assert out.finish_reason == "stop", out.text
        thinking, answer = think_then_answer(out.text)
        jsonschema.validate(answer, PERSON)
        if think == 0:
            assert thinking == ""
        elif think is None:  # forced by the budget (200 - 3 - (2 * 45 + 32) tokens in)
            assert len(thinking) > 0


def test_prompt_that_closed_thinking_is_constrained_from_the_first_token(llm):
    extra = {"json_schema": PERSON, "reasoning_end": MARKER}
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=80, extra_args=extra)
    prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), PERSON)


def test_bad_reasoning_options_are_refused(llm):
    for extra, field in [
        ({"json_schema": PERSON, "reasoning_end": ""}, "reasoning_end"),
        ({"reasoning_end": MARKER}, "reasoning_end"),
        ({"max_reasoning_tokens": 4}, "max_reasoning_tokens"),
        ({"json_schema": PERSON, "max_reasoning_tokens": 4}, "max_reasoning_tokens"),
    ]:
        with pytest.raises(VLLMValidationError, match=f"'{field}'"):
            llm.generate(["x"], SamplingParams(max_tokens=64, extra_args=extra), use_tqdm=False)


def test_served_thinking_then_json(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    xargs = {"json_schema": json.dumps(PERSON), "reasoning_end": MARKER, "max_reasoning_tokens": 5}
    for stream in (False, True):
        response = client.completions.create(
            model="tiny", prompt="Think, then answer:", max_tokens=100, temperature=1.0, seed=2,
            stream=stream, extra_body={"vllm_xargs": xargs},
        )  # fmt: skip
        chunks = list(response) if stream else [response]
        assert chunks[-1].choices[0].finish_reason == "stop"
        _, answer = think_then_answer("".join(c.choices[0].text for c in chunks))
        jsonschema.validate(answer, PERSON)
