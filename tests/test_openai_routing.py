"""OpenAI's ``response_format`` and vLLM's ``structured_outputs`` reach our processors on our
launcher (``constrained.openai_routing``): unchanged OpenAI clients get our guarantees.

The rewrite itself is checked as a pure function; then the session server (``python -m
constrained serve``): ``client.chat.completions.parse`` with a pydantic model, ``json_object``,
``structured_outputs`` (``choice``), streaming, and refusals naming the keyword or the field.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from constrained.openai_routing import route
from constrained.options import OptionError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_response_format_json_schema_becomes_vllm_xargs():
    body = {
        "model": "m",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        "vllm_xargs": {"min_p": 0.1},
    }
    routed = route(body)
    assert "response_format" not in routed
    assert json.loads(routed["vllm_xargs"]["json_schema"]) == SCHEMA
    assert routed["vllm_xargs"]["min_p"] == 0.1  # the request's own options are kept
    assert body["response_format"]  # the caller's body is not modified


def test_json_object_text_and_structured_outputs():
    assert route({"response_format": {"type": "json_object"}})["vllm_xargs"] == {
        "json_object": True
    }
    assert route({"response_format": {"type": "text"}}) is None
    assert route({"model": "m"}) is None
    routed = route({"structured_outputs": {"choice": ["a", "b"], "disable_fallback": False}})
    assert routed["vllm_xargs"] == {"choice": ["a", "b"]} and "structured_outputs" not in routed
    routed = route({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}})
    assert routed["vllm_xargs"]["disable_additional_properties"] is True
    # a field we do not take: the whole request stays with vLLM's own structured outputs
    assert route({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ?"}}) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
         "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "vllm_xargs": {"regex": "a"}}, "regex"),
    ],
)  # fmt: skip
def test_malformed_or_conflicting_requests_name_the_field(body, field):
    with pytest.raises(OptionError) as error:
        route(body)
    assert error.value.field == field


def test_launcher_turns_routing_on_with_strict_tools():
    from constrained.serve import routed_argv

    args, env = routed_argv(["--model", "m", "--tool-call-parser", "qwen3_coder"])
    assert args[-2:] == ["--tool-strict-level", "parameter"]
    assert env == {"CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS": "1",
                   "CONSTRAINED_TOOL_CALL_PARSER": "qwen3_coder"}  # fmt: skip
    given = ["--tool-call-parser=hermes", "--tool-strict-level", "auto"]
    assert routed_argv(given)[0] == given  # the user's level is kept
    assert routed_argv(["--model", "m"]) == (["--model", "m"], {
        "CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS": "1"})  # fmt: skip
    assert routed_argv(["--no-constrained-routing", "--tool-call-parser", "hermes"]) == (
        ["--tool-call-parser", "hermes"],
        {"CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS": "0"},
    )


def test_take_over_moves_vllm_tool_tags_we_write_exactly():
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from constrained.openai_routing import (
        call_on_its_token,
        exact_styles,
        strict_arguments,
        take_over,
    )
    from tests.test_structural_tag import WEATHER, vllm_tag

    assert exact_styles("qwen3_coder") == exact_styles("qwen3_xml") == {"json", "qwen_xml"}
    assert exact_styles("mimo") == exact_styles("hermes") == exact_styles(None) == {"json"}
    for model, parser, taken in [("hermes", "hermes", True), ("qwen_3_5", "qwen3_coder", True),
                                 ("qwen_3_5", "mimo", False)]:  # fmt: skip
        tag = vllm_tag(model, "required", WEATHER)
        params = SamplingParams(
            structured_outputs=StructuredOutputsParams(structural_tag=tag),
            extra_args={"min_p": 0.1},
        )
        take_over(params, parser)
        assert (params.structured_outputs is None) == taken, (model, parser)
        if taken:
            taken_tag = call_on_its_token(tag)  # Qwen3.5's XML: the call's own token
            assert (taken_tag == tag) == (model == "hermes")
            assert params.extra_args == {
                "min_p": 0.1,
                "structural_tag": strict_arguments(taken_tag),
            }
    both = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA),
                          extra_args={"regex": "a"})  # fmt: skip
    with pytest.raises(OptionError) as error:
        take_over(both)
    assert error.value.field == "regex"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)
    languages: list[str] = Field(max_length=2)


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def chat(**kwargs) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "A person, as JSON"}],
            "temperature": 1.0, **kwargs}  # fmt: skip


def test_parse_with_a_pydantic_model(client):
    for seed in range(3):
        completion = client.chat.completions.parse(
            **chat(seed=seed, max_tokens=64), response_format=Person
        )
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop", message.content
        assert isinstance(message.parsed, Person), message.content


def test_json_object_and_structured_outputs_choice(client):
    response = client.chat.completions.create(
        **chat(seed=0, max_tokens=40), response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(response.choices[0].message.content), dict)
    for seed in range(3):
        response = client.completions.create(
            model="tiny", prompt="Answer:", max_tokens=8, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"choice": ["left", "right"]}},
        )  # fmt: skip
        assert response.choices[0].text in ("left", "right")


def test_streaming_response_format(client):
    stream = client.chat.completions.create(
        **chat(seed=1, max_tokens=48), stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text)["a"], int), text


@pytest.mark.parametrize("stream", [False, True])
def test_refused_keyword_and_conflict_get_400_naming_them(server, stream):
    def post(**kwargs) -> httpx.Response:
        body = chat(max_tokens=8, stream=stream, **kwargs)
        return httpx.post(server + "/v1/chat/completions", json=body, timeout=120)

    unique = {"type": "array", "items": {"type": "integer"}, "not": {"uniqueItems": True}}
    refused = post(response_format={"type": "json_schema",
                                    "json_schema": {"name": "u", "schema": unique}})  # fmt: skip
    assert refused.status_code == 400, refused.text
    assert "'json_schema'" in refused.text and "uniqueItems" in refused.text, refused.text
    both = post(response_format={"type": "json_object"}, vllm_xargs={"regex": "a+"})
    assert both.status_code == 400 and "'regex'" in both.text, both.text
    assert post(response_format={"type": "text"}).status_code == 200
