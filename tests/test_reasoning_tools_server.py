"""A thinking model that calls tools, served as Qwen3.5/3.6 are: vLLM's stock server with
``VLLM_PLUGINS=constrained`` (``conftest.stock36``) on the tiny ``qwen3.6`` model with
``--enable-auto-tool-choice --tool-call-parser qwen3_coder --reasoning-parser qwen3`` (the
parsers vLLM pairs with Qwen3.5/3.6), through unchanged OpenAI clients.

- ``response_format`` / ``.parse()``: the answer comes after ``</think>`` (the reasoning
  parser's marker, our default ``reasoning_end``), in ``reasoning`` and a ``content``
  that validates; thinking disabled by the chat template, and a thinking budget.
- ``tools`` with ``tool_choice`` auto / required / named, streaming too: every call's
  arguments, as vLLM's own qwen3_coder parser reads them back, validate against that tool's
  parameters.
- ``choice`` and ``json_object`` after thinking; refusals (HTTP 400 naming the field) with
  the server serving on.

The server is the session's ``stock36`` (shared with ``test_plugin_server.py`` and the
client-library tests).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
    "required": ["query"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)


@pytest.fixture(scope="module")
def server36(stock36) -> str:
    return stock36


@pytest.fixture(scope="module")
def client(server36) -> openai.OpenAI:
    return openai.OpenAI(base_url=server36 + "/v1", api_key="unused", max_retries=0)


def ask(content: str = "What is the weather in Oslo?") -> list[dict]:
    return [{"role": "user", "content": content}]


def no_thinking() -> dict:
    return {"chat_template_kwargs": {"enable_thinking": False}}


def reasoning_of(message) -> str:
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None) or ""


def parallel(calls: list) -> list:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_parse_thinks_then_answers_valid(client):
    def parse(seed: int, extra: dict):
        return client.chat.completions.parse(
            model="tiny", messages=ask("A person, as JSON"), response_format=Person,
            max_tokens=240, temperature=1.0, seed=seed, extra_body=extra,
        )  # fmt: skip

    budget = {"vllm_xargs": {"max_reasoning_tokens": 12}}
    thinking, budgeted, direct = parallel(
        [lambda: parse(1, {}), lambda: parse(2, budget), lambda: parse(3, no_thinking())]
    )
    for completion in (thinking, budgeted, direct):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message
        assert isinstance(choice.message.parsed, Person), choice.message.content
    assert reasoning_of(thinking.choices[0].message)  # it thought first
    assert reasoning_of(budgeted.choices[0].message)
    assert budgeted.usage.completion_tokens < thinking.usage.completion_tokens
    assert not reasoning_of(direct.choices[0].message)  # the template closed thinking


def test_tool_calls_validate_for_every_tool_choice(client):
    named = {"type": "function", "function": {"name": "search"}}

    def create(seed: int, tool_choice, extra: dict | None = None):
        return client.chat.completions.create(
            model="tiny", messages=ask(), tools=TOOLS, tool_choice=tool_choice,
            max_tokens=200, temperature=1.0, seed=seed, extra_body=extra,
        )  # fmt: skip

    cases = [("required", {}), ("required", no_thinking()), (named, {}), (named, no_thinking()),
             ("auto", no_thinking())]  # fmt: skip
    results = parallel([lambda c=c, i=i: create(i, *c) for i, c in enumerate(cases)])
    for (tool_choice, _), completion in zip(cases, results, strict=True):
        message = completion.choices[0].message
        if tool_choice == "auto":
            assert completion.choices[0].finish_reason in ("stop", "tool_calls")
        else:
            assert message.tool_calls, (tool_choice, message)
        for call in message.tool_calls or []:
            if tool_choice == named:
                assert call.function.name == "search"
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, SCHEMAS[call.function.name])
    assert reasoning_of(results[0].choices[0].message)  # required, thinking first
    assert not reasoning_of(results[1].choices[0].message)


def test_auto_tool_calls_when_the_model_calls(client):
    """``tool_choice="auto"``: free text, or calls whose arguments validate. The random model
    rarely writes ``<tool_call>`` on its own, so it is made its favourite (``logit_bias``):
    every completion then calls, after thinking (banned while thinking: the reasoning
    parser would read it as the end of thinking) and with thinking off."""
    from transformers import AutoTokenizer

    from constrained.tiny_model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_model("qwen3.6")))
    tool_call = tokenizer.convert_tokens_to_ids("<tool_call>")

    def create(seed: int, extra: dict):
        return client.chat.completions.create(
            model="tiny", messages=ask(), tools=TOOLS, tool_choice="auto", max_tokens=300,
            temperature=1.0, seed=seed, logit_bias={str(tool_call): 100}, extra_body=extra,
        )  # fmt: skip

    thinking = {"vllm_xargs": {"max_reasoning_tokens": 8}}
    results = parallel([lambda: create(11, thinking), lambda: create(12, no_thinking())])
    for completion in results:
        message = completion.choices[0].message
        assert message.tool_calls, message
        for call in message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert reasoning_of(results[0].choices[0].message)
    assert not reasoning_of(results[1].choices[0].message)


def test_streamed_thinking_and_tool_call(client):
    stream = client.chat.completions.create(
        model="tiny", messages=ask(), tools=TOOLS, tool_choice="required", max_tokens=200,
        temperature=1.0, seed=5, stream=True,
    )  # fmt: skip
    reasoning, calls = "", {}
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += reasoning_of(delta)
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    assert reasoning and calls
    for entry in calls.values():
        jsonschema.validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])


def test_choice_and_json_object_after_thinking(client):
    def choice(seed: int):
        return client.chat.completions.create(
            model="tiny", messages=ask("left or right?"), max_tokens=120, temperature=1.0,
            seed=seed, extra_body={"structured_outputs": {"choice": ["left", "right"]}},
        )  # fmt: skip

    def json_object(seed: int):
        return client.chat.completions.create(
            model="tiny", messages=ask("Any object"), max_tokens=120, temperature=1.0,
            seed=seed, response_format={"type": "json_object"},
            extra_body={"vllm_xargs": {"max_reasoning_tokens": 8}},
        )  # fmt: skip

    picked, obj = parallel([lambda: choice(1), lambda: json_object(2)])
    assert picked.choices[0].message.content in ("left", "right")
    assert reasoning_of(picked.choices[0].message)
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_refusals_name_the_field_and_the_server_serves_on(server36, client, stream):
    def post(**body) -> httpx.Response:
        body = {"model": "tiny", "messages": ask(), "max_tokens": 8, "stream": stream, **body}
        return httpx.post(server36 + "/v1/chat/completions", json=body, timeout=120)

    unchecked = {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},  # recursive
                 "$defs": {"X": {"type": "array", "items": {"$ref": "#/$defs/X"}}}}  # fmt: skip
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": unchecked}}]
    for body, field in (
        ({"tools": bad_tool, "tool_choice": "required"}, "tools"),
        ({"vllm_xargs": {"structural_tag": "{"}}, "structural_tag"),
        ({"vllm_xargs": {"json_schema": "{}", "reasoning_end": " "}}, "reasoning_end"),
        ({"vllm_xargs": {"reasoning_end": "</think>"}}, "reasoning_end"),  # no constraint
        ({"vllm_xargs": {"choice": json.dumps(["a", "a"])}}, "choice"),
    ):
        response = post(**body)
        assert response.status_code == 400, (field, response.text)
        assert f"'{field}'" in response.text, response.text
    served = client.chat.completions.create(
        model="tiny", messages=ask(), tools=TOOLS, tool_choice="required", max_tokens=160,
        temperature=1.0, seed=9, extra_body=no_thinking(),
    )  # fmt: skip
    call = served.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
