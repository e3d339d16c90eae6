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
        elif think == 7:  # forced after 7 tokens: complete 3 tokens later at the latest
            assert marker_end(llm, out.token_ids) < 7 + 3, out.token_ids
        elif think is None:  # forced by the budget (200 - 3 - (2 * 45 + 32) tokens in)
            assert len(thinking) > 0


def marker_end(llm, token_ids) -> int:
    """The index of the output token that completes the marker."""
    decode = llm.get_tokenizer().decode
    return next(i for i in range(len(token_ids)) if MARKER in decode(token_ids[: i + 1]))


def test_stop_tokens_do_not_end_thinking(llm):
    """A thinking request's own stop tokens (the generation config's ``<|im_end|>``, any
    ``stop_token_ids``) are banned until the marker, as end-of-sequence is: made the model's
    favourite, ``<|im_end|>`` still does not end it before its answer."""
    im_end = llm.get_tokenizer().convert_tokens_to_ids("<|im_end|>")
    extra = {"json_schema": PERSON, "reasoning_end": MARKER, "max_reasoning_tokens": 5}
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=300, stop_token_ids=[im_end],
                            logit_bias={im_end: 100.0}, extra_args=extra)  # fmt: skip
    out = llm.generate(["Think, then answer in JSON:"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    assert 5 <= marker_end(llm, out.token_ids) < 5 + 3, out.token_ids  # thought 5 tokens
    jsonschema.validate(think_then_answer(out.text)[1], PERSON)


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


def test_offline_qwen36_reasoning_parser_gates_every_constraint():
    """Offline on the tiny qwen3.6 model with ``reasoning_parser="qwen3"`` (a subprocess):
    no ``reasoning_end`` given, yet each constrained request thinks until ``</think>`` (one
    special token here), then answers valid; with thinking disabled by the chat template it
    answers from the first token; a tool call given as a ``structural_tag`` validates."""
    import subprocess
    import sys

    from constrained.tiny_model import build_tiny_model
    from tests.test_grammar_bookkeeping import TOOL_CALL

    model = str(build_tiny_model("qwen3.6"))
    args = [sys.executable, "-m", "tests.reasoning_offline_run", model, json.dumps(PERSON),
            TOOL_CALL]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    results = json.loads(line.removeprefix("RESULT "))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    end, eos = (
        tokenizer.convert_tokens_to_ids("</think>"),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    for name, ids in results.items():
        assert ids[-1] in (eos, tokenizer.eos_token_id), (name, ids[-5:])
        thinking = name != "no_thinking"
        assert (end in ids) == thinking, name
        answer = tokenizer.decode(ids[ids.index(end) + 1 : -1] if thinking else ids[:-1],
                                  skip_special_tokens=False)  # fmt: skip
        if name == "tool_call":
            body = answer.strip().removeprefix("<tool_call>").removesuffix("</tool_call>")
            assert json.loads(body)["n"] in (1, 22), answer
        else:
            jsonschema.validate(json.loads(answer.strip()), PERSON)
    assert results["budget"].index(end) <= 6 < results["thinking"].index(end)
