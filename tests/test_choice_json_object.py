"""``choice`` and ``json_object`` on the real vLLM engine (V1, CPU build), offline and served.

``choice``: the output is exactly one of the strings (as vLLM's ``choice``); ``json_object``:
the output is a JSON object (as OpenAI's ``response_format={"type": "json_object"}``). Both
are constraints like ``json_schema``: closed by ``max_tokens``, refused with a budget too small.
"""

from __future__ import annotations

import json

import openai
import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from constrained import Options

CHOICES = ["yes", "no", "maybe later", "n/a (see notes)"]


def generate(llm, extra: dict, seed: int, max_tokens: int = 48):
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, extra_args=extra)
    return llm.generate(["Answer:"], params, use_tqdm=False)[0].outputs[0]


def test_choice_output_is_exactly_one_of_the_strings(llm):
    seen = set()
    for seed in range(12):
        out = generate(llm, {"choice": CHOICES}, seed)
        assert out.finish_reason == "stop", out
        assert out.text in CHOICES, out.text
        seen.add(out.text)
    assert len(seen) >= 2, seen  # the model still chooses: the mask allows every string


def test_json_object_output_is_an_object(llm):
    for seed in range(6):
        out = generate(llm, {"json_object": True}, seed, max_tokens=40)
        assert out.finish_reason == "stop", out  # closed by max_tokens when it runs long
        assert isinstance(json.loads(out.text), dict), out.text


def test_options_model_and_budget_refusal(llm):
    extra = Options(choice=["alpha", "beta"]).to_extra_args()
    assert extra == {"choice": ["alpha", "beta"]}
    with pytest.raises(VLLMValidationError, match="'max_tokens'"):
        generate(llm, {"choice": ["a considerably longer answer than one token"]}, 0, 2)


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_served_choice_and_json_object(client, stream):
    for xargs in ({"choice": CHOICES}, {"json_object": True}):
        response = client.completions.create(
            model="tiny", prompt="Answer:", max_tokens=40, temperature=1.0, seed=1,
            stream=stream, extra_body={"vllm_xargs": xargs},
        )  # fmt: skip
        chunks = list(response) if stream else [response]
        text = "".join(c.choices[0].text for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop", xargs
        if "choice" in xargs:
            assert text in CHOICES, text
        else:
            assert isinstance(json.loads(text), dict), text


def test_served_choice_refusal_names_the_field(client):
    with pytest.raises(openai.BadRequestError, match="'choice'"):
        client.completions.create(
            model="tiny", prompt="Answer:", max_tokens=8,
            extra_body={"vllm_xargs": {"choice": ["same", "same"]}},
        )  # fmt: skip
