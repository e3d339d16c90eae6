"""vLLM's STOCK server with our package installed and named only by ``VLLM_PLUGINS``
(``conftest.stock36``: ``python -m vllm.entrypoints.openai.api_server``, no
``--logits-processors`` of ours, no ``--middleware``): ``vllm_xargs`` options applied,
``response_format`` through ``.parse()``, strict tools, a bad option refused with HTTP 400
naming it (streaming too) and the server serving on, another package's processor and its key
beside ours, and keys that are nobody's passed through.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)


@pytest.fixture(scope="module")
def client(stock36) -> openai.OpenAI:
    return openai.OpenAI(base_url=stock36 + "/v1", api_key="unused", max_retries=0)


def test_vllm_xargs_json_schema_is_applied(client):
    """The reason for entry points: without them the stock server ignores it (HTTP 200, noise).
    (This server's reasoning parser makes ``</think>`` a constrained request's default
    ``reasoning_end``; the chat template with thinking off closes the thinking block.)"""
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "JSON"}], max_tokens=200, seed=4,
        extra_body={"vllm_xargs": {"json_schema": json.dumps(SCHEMA)}, **NO_THINKING},
    )  # fmt: skip
    jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)


def test_response_format_parse_after_thinking(client):
    completion = client.chat.completions.parse(
        model="tiny", messages=[{"role": "user", "content": "A person"}], response_format=Person,
        max_tokens=240, temperature=1.0, seed=5,
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(completion.choices[0].message.parsed, Person)


def test_strict_tools_required_and_named(client):
    tool = {"type": "function", "function": {
        "name": "get_weather", "strict": True, "parameters": {
            "type": "object", "additionalProperties": False, "required": ["city", "units"],
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}  # fmt: skip
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed, choice in enumerate(["required", named]):
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[tool],
            tool_choice=choice, max_tokens=200, temperature=1.0, seed=seed, extra_body=NO_THINKING,
        )  # fmt: skip
        [call] = out.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_bad_option_is_400_naming_it_and_the_server_serves_on(stock36, client, stream):
    for xargs, field in [({"min_p": 2.0}, "min_p"), ({"min_pp": 0.1}, "min_pp"),
                         ({"regex": "(unclosed"}, "regex")]:  # fmt: skip
        response = httpx.post(
            stock36 + "/v1/completions",
            json={"model": "tiny", "prompt": "x", "max_tokens": 4, "stream": stream,
                  "vllm_xargs": xargs},
            timeout=120,
        )  # fmt: skip
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert f"'{field}'" in message
        assert field != "min_pp" or "Did you mean 'min_p'" in message
    out = client.completions.create(model="tiny", prompt="x", max_tokens=4)
    assert out.choices[0].finish_reason in ("length", "stop")


def test_another_plugins_processor_and_key_beside_ours(stock36, client):
    """``tests.foreign_processor`` bans the token it is given; our regex still holds. A
    processor we do not know is built, so keys that are nobody's we know pass (it may read
    them); the launcher's server, with only ours, refuses them (``test_bad_requests``)."""
    tokens = httpx.post(stock36 + "/tokenize", json={"model": "tiny", "prompt": "7"}).json()
    [seven] = tokens["tokens"]
    for seed in range(3):
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Digits"}], max_tokens=12,
            temperature=1.0, seed=seed,
            extra_body={"vllm_xargs": {"regex": "[0-9]{8}", "foreign_ban": seven,
                                       "nobodys_key": "passed through"}, **NO_THINKING},
        )  # fmt: skip
        text = out.choices[0].message.content
        assert re.fullmatch("[0-9]{8}", text) and "7" not in text, text
    refused = httpx.post(
        stock36 + "/v1/completions",
        json={"model": "tiny", "prompt": "x", "max_tokens": 4, "vllm_xargs": {"foreign_ban": -1}},
        timeout=120,
    )
    assert refused.status_code == 400 and "foreign_ban" in refused.text
    for stream in (False, True):
        passed = httpx.post(
            stock36 + "/v1/completions",
            json={"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": stream,
                  "vllm_xargs": {"frobnicate_penalty": 1.0}},
            timeout=120,
        )  # fmt: skip
        assert passed.status_code == 200, passed.text
