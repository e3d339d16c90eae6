"""Local, non-recursive ``$ref`` in tool parameters (#29): pydantic writes every ``Enum`` field
and nested model as one. They are inlined (``constrained.schema.refs``) in the request's tools
before vLLM's tool parser reads them, and in the Qwen3 XML parameters of a structural tag;
recursive ones stay refused, naming ``$ref``."""

from __future__ import annotations

import copy
import enum
import json

import jsonschema
import pytest
from pydantic import BaseModel, Field

from constrained.grammars import GrammarError, GrammarSpec, compile_now, load_vocab
from constrained.openai_routing import check_tools, inline_tool_refs, route
from constrained.options import OptionError, Options
from constrained.schema.refs import MAX_INLINED, inline_local_refs

WIDTH = 151_936


class Units(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str = Field(max_length=10)
    country: str = Field(max_length=4)


class Forecast(BaseModel):
    place: Place
    units: Units = Field(description="temperature units")
    days: int = Field(ge=1, le=7)
    fallback: Units | None = None


SCHEMA = Forecast.model_json_schema()
RECURSIVE = {
    "type": "object",
    "properties": {"node": {"$ref": "#/$defs/Node"}},
    "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
}
NAME = "get_forecast"


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": NAME, "parameters": parameters}}


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


def vllm_tag(schema: dict) -> str:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    tag = get_model_structural_tag(
        "qwen_3_5", [ChatCompletionToolsParam.model_validate(tool(schema))], "required", False,
        strict_level=ToolStrictLevel.PARAMETER,
    )  # fmt: skip
    return json.dumps(tag.model_dump())


def compiled(vocab, tag: str):
    return compile_now(GrammarSpec("structural_tag", Options(structural_tag=tag).structural_tag),
                       vocab)  # fmt: skip


# --- the schema helper --------------------------------------------------------------------


def test_pydantic_refs_are_inlined_and_mean_the_same():
    before = copy.deepcopy(SCHEMA)
    inlined = inline_local_refs(SCHEMA)
    assert before == SCHEMA  # the input is not changed
    assert "$ref" not in json.dumps(inlined) and "$defs" not in inlined
    assert inlined["properties"]["units"] == {
        "enum": ["celsius", "fahrenheit"], "title": "Units", "type": "string",
        "description": "temperature units",
    }  # fmt: skip
    assert inlined["properties"]["place"]["required"] == ["city", "country"]
    good = {"place": {"city": "Oslo", "country": "NO"}, "units": "celsius", "days": 2,
            "fallback": None}  # fmt: skip
    bad = [{**good, "units": "kelvin"}, {**good, "place": {"city": "Oslo"}},
           {**good, "fallback": "x"}]  # fmt: skip
    for schema in (SCHEMA, inlined):
        jsonschema.validate(good, schema)
        for instance in bad:
            assert not jsonschema.Draft202012Validator(schema).is_valid(instance)


def test_what_cannot_be_inlined_stays():
    assert inline_local_refs(RECURSIVE) == RECURSIVE  # recursive: refs and $defs kept
    root = {"type": "object", "properties": {"self": {"$ref": "#"}}}
    assert inline_local_refs(root) is root
    remote = {"properties": {"a": {"$ref": "https://example.com/a.json"}}}
    assert inline_local_refs(remote) is remote
    dangling = {"properties": {"a": {"$ref": "#/$defs/missing"}}}
    assert inline_local_refs(dangling) == dangling
    # a reference that fans out past MAX_INLINED schema objects: left as written
    defs = {f"d{i}": {"type": "array", "prefixItems": [{"$ref": f"#/$defs/d{i + 1}"}] * 4}
            for i in range(12)}  # fmt: skip
    defs["d12"] = {"type": "integer"}
    wide = {"$defs": defs, "properties": {"a": {"$ref": "#/$defs/d0"}}}
    assert MAX_INLINED < 4**12 and inline_local_refs(wide) is wide
    # non-recursive refs beside a recursive one are inlined; the recursive one stays
    mixed = {"properties": {"u": {"$ref": "#/$defs/U"}, "n": {"$ref": "#/$defs/Node"}},
             "$defs": {"U": {"enum": ["a"]}, **RECURSIVE["$defs"]}}  # fmt: skip
    out = inline_local_refs(mixed)
    assert out["properties"]["u"] == {"enum": ["a"]} and "$defs" in out


def test_siblings_of_a_ref_merge_only_when_that_means_the_same():
    defs = {"$defs": {"S": {"type": "string", "maxLength": 3}, "P": {"properties": {"a": {}}}}}
    merged = inline_local_refs({**defs, "properties": {"x": {"$ref": "#/$defs/S", "minLength": 1}}})
    assert merged["properties"]["x"] == {"type": "string", "maxLength": 3, "minLength": 1}
    both = inline_local_refs({**defs, "properties": {"x": {"$ref": "#/$defs/S", "maxLength": 9}}})
    assert both["properties"]["x"] == {"maxLength": 9, "allOf": [{"type": "string",
                                                                   "maxLength": 3}]}  # fmt: skip
    # additionalProperties beside a target's properties would change meaning: allOf
    closed = {"$ref": "#/$defs/P", "additionalProperties": False}
    out = inline_local_refs({**defs, "properties": {"x": closed}})["properties"]["x"]
    assert out == {"additionalProperties": False, "allOf": [{"properties": {"a": {}}}]}
    for instance in ({"a": 1}, {"b": 1}, "s"):
        for schema in ({**defs, "properties": {"x": closed}}, {"properties": {"x": out}}):
            valid = jsonschema.Draft202012Validator(schema).is_valid({"x": instance})
            assert valid == (instance == "s"), (instance, schema)


# --- the request's tools and the structural tag -------------------------------------------


def test_request_tools_are_inlined_before_vllm_reads_them():
    body = {"model": "m", "messages": [], "tools": [tool(SCHEMA)], "tool_choice": "required"}
    check_tools(body, tool_parser="qwen3_coder")  # no refusal
    routed = route(body)
    assert routed["tools"][0]["function"]["parameters"] == inline_local_refs(SCHEMA)
    assert body["tools"][0]["function"]["parameters"] == SCHEMA  # the input is not changed
    assert inline_tool_refs({**body, "tools": [tool({"type": "object"})]}) is None
    assert route({**body, "tool_choice": "none"}) is None  # no tool call: nothing to do


def test_recursive_refs_in_tools_stay_refused_naming_ref(vocab):
    body = {"model": "m", "messages": [], "tools": [tool(RECURSIVE)], "tool_choice": "required"}
    with pytest.raises(OptionError) as error:
        check_tools(body, tool_parser="qwen3_coder")
    assert error.value.field == "tools" and "'$ref'" in str(error.value)
    with pytest.raises(GrammarError) as refused:
        compiled(vocab, vllm_tag(RECURSIVE))
    assert refused.value.keyword == "$ref"


def test_a_pydantic_model_with_an_enum_and_a_nested_model_compiles_as_a_tool(vocab):
    grammar = compiled(vocab, vllm_tag(SCHEMA))  # the tag as vLLM writes it, $ref and all

    def call(*params: tuple[str, str]) -> str:
        body = "\n".join(f"<parameter={k}>\n{v}\n</parameter>" for k, v in params)
        return f"<tool_call>\n<function={NAME}>\n{body}\n</function>\n</tool_call>"

    def accepts(text: str) -> bool:
        matcher = grammar.matcher()
        return matcher.consume(vocab.hf_tokenizer.encode(text)) and matcher.accepts_end()

    place = ("place", '{"city":"Oslo","country":"NO"}')
    assert accepts(call(place, ("units", "celsius"), ("days", "3")))
    assert accepts(call(place, ("units", "celsius"), ("days", "3"), ("fallback", "fahrenheit")))
    assert not accepts(call(place, ("units", "kelvin"), ("days", "3")))  # the Enum
    assert not accepts(call(("place", '{"city":"Oslo"}'), ("units", "celsius"), ("days", "3")))


def test_random_walks_through_the_masks_parse_back_valid(vocab):
    """Outputs drawn at random from the masks alone, read back by vLLM's qwen3_coder parser
    given the tools as the server hands them on (inlined), validate against the original
    schema with its ``$defs``."""
    import random

    import torch
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    from constrained.grammars.closing import allowed_ids, find_witness
    from constrained.grammars.matcher import words_for

    grammar = compiled(vocab, vllm_tag(SCHEMA))
    body = route({"model": "m", "messages": [], "tools": [tool(SCHEMA)],
                  "tool_choice": "required"})  # fmt: skip
    request = ChatCompletionRequest.model_validate(body)
    parser = ToolParserManager.get_tool_parser("qwen3_coder")(vocab.hf_tokenizer, request.tools)
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    rng = random.Random(3)
    seen_units = set()
    for _ in range(10):
        matcher, tokens = grammar.matcher(), []
        while len(tokens) < 120:
            matcher.fill(bitmask, 0)
            allowed = allowed_ids(bitmask[0], vocab.width).nonzero()[0].tolist()
            ending = vocab.eos_token_id in allowed
            if ending and (rng.random() < 0.5 or len(allowed) == 1):
                break
            token = rng.choice([t for t in allowed if t != vocab.eos_token_id])
            assert matcher.consume([token])
            tokens.append(token)
        finish = find_witness(matcher, vocab, 256)
        assert finish is not None and matcher.consume(finish) and matcher.accepts_end()
        text = vocab.hf_tokenizer.decode(tokens + finish, skip_special_tokens=False)
        [call] = parser.extract_tool_calls(text, request).tool_calls
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMA)
        Forecast.model_validate(arguments)
        seen_units.add(arguments["units"])
    assert seen_units  # the Enum parameter is read back as its text


# --- on the stock server ------------------------------------------------------------------


def test_served_tool_call_with_refs_validates(stock36):
    """``tool_choice`` required, the tool's parameters a pydantic model with an ``Enum`` and a
    nested model (``$ref`` into ``$defs``): the call read back validates against the schema
    as the client sent it."""
    import openai

    client = openai.OpenAI(base_url=stock36 + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Forecast?"}], tools=[tool(SCHEMA)],
        tool_choice="required", max_tokens=200, temperature=1.0, seed=11,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == NAME
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMA)
    assert isinstance(Forecast.model_validate(arguments).units, Units)
