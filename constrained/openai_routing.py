"""OpenAI-shaped structured output and tool calls, routed to our processors on our launcher.

A client that never heard of ``vllm_xargs`` asks for structured output with OpenAI's
``response_format`` (``client.chat.completions.parse(..., response_format=Person)`` sends
``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}``),
with vLLM's ``structured_outputs`` request field, or with ``tools`` and ``tool_choice``. Two
steps route them to our grammar processor instead of vLLM's built-in structured outputs; the
same keys, checks and errors as ``vllm_xargs`` then apply:

1. ``route(body)``, in the server middleware (``stream_checks``) before vLLM reads the body,
   moves the request's own fields into ``vllm_xargs``:

   - ``response_format: {"type": "json_schema", "json_schema": {"schema": S}}``:
     ``json_schema: S``; ``{"type": "json_object"}``: ``json_object: true``;
     ``{"type": "structural_tag", ...}``: ``structural_tag``;
   - ``structured_outputs: {"json": S}``: ``json_schema: S``; its ``regex``, ``grammar``,
     ``choice``, ``json_object``, ``structural_tag`` and ``disable_additional_properties``:
     the option of that name.

   A request with ``tools`` (and ``tool_choice`` other than ``none``) keeps them: vLLM's tool
   parser builds one constraint of the tools and the response format (step 2). Their
   parameters' local, non-recursive ``$ref`` (pydantic's ``$defs``) are inlined first
   (``inline_tool_refs``): vLLM's tool parser types what it reads back by the schema as
   written, so it and our grammar must see the same one.
2. ``take_over(params)``, at admission, moves what vLLM itself put in
   ``SamplingParams.structured_outputs`` into our options: vLLM's tool parser builds a
   structural tag of the request's tools (each tool's call format, ``tool_choice``,
   ``parallel_tool_calls``, merged with a ``response_format``), and we enforce it, each
   call's arguments strict (``strict_arguments``: no keys beyond the parameters). vLLM's
   parsers read the output back as usual. ``check_tools(body)`` first refuses, naming
   ``tools``, a tool whose parameters use a keyword we cannot enforce.

``response_format: {"type": "text"}`` is left alone. A ``structured_outputs`` with a field we
do not take (``whitespace_pattern``) is left to vLLM whole. On only where our launcher turns it
on (``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=1``); its ``--no-constrained-routing`` leaves it off.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from constrained.options import GRAMMAR_FIELDS, OptionError

# vLLM's StructuredOutputsParams fields we take, and the option each becomes.
STRUCTURED_OUTPUTS_FIELDS = {
    "json": "json_schema",
    "regex": "regex",
    "grammar": "grammar",
    "choice": "choice",
    "json_object": "json_object",
    "disable_additional_properties": "disable_additional_properties",
    "structural_tag": "structural_tag",
}
# Fields that say "no change" at their default value (vLLM sends them with every request).
_NEUTRAL = {"disable_fallback": False, "disable_any_whitespace": False,
            "disable_additional_properties": False}  # fmt: skip


def _from_response_format(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        raise OptionError("response_format", f"must be an object, got {value!r:.80}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise OptionError(
                "response_format", 'type "json_schema" needs "json_schema": {"schema": {...}}'
            )
        return {"json_schema": spec["schema"]}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps(value)}
    raise OptionError(
        "response_format",
        f'type must be "text", "json_object", "json_schema" or "structural_tag", got {kind!r}',
    )


def _from_structured_outputs(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None  # vLLM's request model answers it
    given = {k: v for k, v in value.items() if v is not None and _NEUTRAL.get(k, object()) != v}
    if any(k not in STRUCTURED_OUTPUTS_FIELDS for k in given):
        return None  # a field we do not take: vLLM's own structured outputs serve it whole
    return {STRUCTURED_OUTPUTS_FIELDS[k]: v for k, v in given.items()} or None


def route(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request body with its OpenAI / vLLM structured-output fields moved into
    ``vllm_xargs``, or ``None`` when there is nothing to move.

    Raises:
        OptionError: naming ``response_format`` or ``structured_outputs`` when the field is
            malformed or both are given; naming the ``vllm_xargs`` option when it constrains
            the output too.
    """
    if calls_tools(body):
        # vLLM's tool parser merges the response format in; ``take_over`` moves it
        return inline_tool_refs(body)
    moved: dict[str, Any] = {}
    sources = []
    if "response_format" in body and body["response_format"] is not None:
        options = _from_response_format(body["response_format"])
        if options:
            moved.update(options)
            sources.append("response_format")
    if body.get("structured_outputs") is not None:
        options = _from_structured_outputs(body["structured_outputs"])
        if options:
            if moved:
                raise OptionError(
                    "structured_outputs", "give response_format or structured_outputs, not both"
                )
            moved.update(options)
            sources.append("structured_outputs")
    if not moved:
        return None
    xargs = body.get("vllm_xargs") or {}
    if not isinstance(xargs, dict):
        return None  # vLLM's request model refuses it
    twice = [k for k in (*GRAMMAR_FIELDS, *moved) if k in xargs]
    if twice:  # named as offline, where vllm_xargs' option meets vLLM's structured_outputs
        raise OptionError(
            twice[0], f"cannot be combined with the request's '{sources[0]}': both constrain "
            "the same output; give one",
        )  # fmt: skip
    if not isinstance(moved.get("json_schema", ""), str):  # vllm_xargs values are text
        moved["json_schema"] = json.dumps(moved["json_schema"])
    routed = {k: v for k, v in body.items() if k not in sources}
    routed["vllm_xargs"] = {**xargs, **moved}
    return routed


def inline_tool_refs(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request body with the local, non-recursive ``$ref`` of each tool's parameters
    inlined (``constrained.schema.refs``), or ``None`` when there are none. Recursive and
    remote ones stay: ``check_tools`` refuses them, naming ``$ref``."""
    from constrained.schema.refs import inline_local_refs

    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    inlined, changed = [], False
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        new = inline_local_refs(parameters)
        if new is parameters:
            inlined.append(tool)
            continue
        inlined.append({**tool, "function": {**function, "parameters": new}})
        changed = True
    return {**body, "tools": inlined} if changed else None


def calls_tools(body: dict[str, Any]) -> bool:
    """The request offers tools the model may call (``tool_choice`` is not ``none``; vLLM's
    default with tools is ``auto``)."""
    return bool(body.get("tools")) and body.get("tool_choice", "auto") != "none"


def take_over(params: Any, tool_parser: str | None = None) -> None:
    """Move vLLM's structured outputs of one request (``params``: its ``SamplingParams``)
    into our options, in place: for tools, vLLM's tool parser (``tool_parser``, the server's
    ``--tool-call-parser``) put a structural tag there.

    Raises:
        OptionError: the request also gives one of our constraints (naming it).
    """
    given = params.structured_outputs
    if given is None:
        return
    fields = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
    moved = _from_structured_outputs({k: v for k, v in fields.items() if not k.startswith("_")})
    if not moved:
        return  # a field we do not take: vLLM's own structured outputs serve it
    if not written_here(moved.get("structural_tag"), tool_parser):
        return  # a tool-call style we do not write exactly: vLLM's own enforces it
    extra = dict(params.extra_args or {})
    twice = [k for k in GRAMMAR_FIELDS if k in extra]
    if twice:
        raise OptionError(
            twice[0], "cannot be combined with the request's response_format, structured "
            "outputs or tools: both constrain the same output; give one",
        )  # fmt: skip
    if "structural_tag" in moved:
        moved["structural_tag"] = strict_arguments(call_on_its_token(moved["structural_tag"]))
    params.extra_args = {**extra, **moved}
    params.structured_outputs = None


# vLLM's tag for Qwen3.5's XML calls starts a call only at this text; its tool parser reads a
# call from the first token alone (one special token in Qwen3.5/3.6's vocabulary).
_QWEN_XML_TRIGGER, _QWEN_CALL = "<tool_call>\n<function=", "<tool_call>"


def call_on_its_token(structural_tag: str) -> str:
    """vLLM's structural tag with Qwen3.5's XML call trigger cut to ``<tool_call>``: a model
    that writes ``<tool_call>`` is held to a complete, valid call (vLLM's trigger leaves it
    free text until ``\n<function=`` follows, and a ``<tool_call>`` followed by anything else
    is a call its parser cannot read: the response loses it). Other tags come back as given.
    """
    from constrained.grammars.structural_tag import parts

    try:
        tag = json.loads(structural_tag)
        found = tag["format"]
    except (ValueError, KeyError, TypeError):
        return structural_tag  # admission refuses it, naming the field
    changed = False
    for _, node in parts(found):  # anywhere: vLLM nests it beside a response_format
        if node.get("type") == "triggered_tags" and node.get("triggers") == [_QWEN_XML_TRIGGER]:
            node["triggers"], changed = [_QWEN_CALL], True
    return json.dumps(tag, ensure_ascii=False) if changed else structural_tag


# Keywords under which closing an object could loosen the schema (``not``, ``oneOf``, ``if``)
# or forbid keys another branch declares (``anyOf``, ``allOf``): arguments using one stay as
# written.
_COMBINING = frozenset({"not", "oneOf", "anyOf", "allOf", "if", "then", "else",
                        "dependentSchemas", "dependencies", "$ref"})  # fmt: skip


def strict_arguments(structural_tag: str) -> str:
    """vLLM's tool-call tag with each call's arguments held as vLLM's own structured outputs
    hold them (xgrammar's strict mode, as OpenAI's strict tools): an object schema that
    declares ``properties`` and says nothing about extra keys gets none (an object with no
    ``properties`` stays any object). Every call still validates against the tool's
    parameters as written. The arguments are the schema parts inside a ``tag`` (a call:
    begin, arguments, end) of the calls' format: with a response format beside the calls
    vLLM writes ``{"type": "or", "elements": [calls, response format]}``, and the response
    format keeps its meaning. Parameters that use a combinator (``_COMBINING``) stay as
    written.
    """
    from constrained.grammars.structural_tag import SCHEMA_FORMATS, parts

    try:
        tag = json.loads(structural_tag)
        calls = tag["format"]
        if calls.get("type") == "or":
            calls = calls["elements"][0]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return structural_tag  # admission refuses it, naming the field
    changed = False
    for _, call in parts(calls):
        if call.get("type") != "tag":
            continue
        for _, part in parts(call.get("content"), ""):
            schema = part.get("json_schema")
            if part["type"] in SCHEMA_FORMATS and isinstance(schema, dict):
                changed |= _close_declared(schema)
    return json.dumps(tag, ensure_ascii=False) if changed else structural_tag


def _close_declared(schema: dict[str, Any]) -> bool:
    """``additionalProperties: false`` on each object schema in ``schema`` (in place) that
    declares ``properties`` and is silent about extra keys, unless a combinator is used
    anywhere in it; whether anything changed."""
    from constrained.schema.user_input import says_extra_keys
    from constrained.schema.walk import iter_subschemas

    subs = [sub for _, sub in iter_subschemas(schema)]
    if any(_COMBINING & sub.keys() for sub in subs):
        return False
    silent = [s for s in subs if isinstance(s.get("properties"), dict) and not says_extra_keys(s)]
    for sub in silent:
        sub["additionalProperties"] = False
    return bool(silent)


def exact_styles(tool_parser: str | None) -> frozenset[str]:
    """The argument styles whose calls the server's tool parser reads back exactly as we
    write them: JSON (every JSON-style parser reads it with a JSON parser), and Qwen3.5's
    XML for vLLM's Qwen3 parser (``qwen3_coder`` / ``qwen3_xml``), whose reading
    ``grammars/qwen_xml.py`` follows. Other parsers of XML-style calls (MiMo keeps values
    verbatim, ...) read them otherwise: their calls stay with vLLM's own structured outputs."""
    if not tool_parser:
        return frozenset({"json"})
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser

    try:
        parser = ToolParserManager.get_tool_parser(tool_parser)
    except Exception:  # a plugin's parser: only JSON is sure
        return frozenset({"json"})
    qwen3 = parser is Qwen3EngineToolParser
    return frozenset({"json", "qwen_xml"}) if qwen3 else frozenset({"json"})


def written_here(structural_tag: str | None, tool_parser: str | None = None) -> bool:
    """Every schema part of the tag is in a style the tool parser reads back as we write it
    (``exact_styles``)."""
    from constrained.grammars.structural_tag import SCHEMA_FORMATS, parts
    from constrained.grammars.xgrammar_backend import style_of

    if structural_tag is None:
        return True
    try:
        found = json.loads(structural_tag)["format"]
    except (ValueError, KeyError, TypeError):
        return True  # not xgrammar's format: admission refuses it, naming the field
    exact = exact_styles(tool_parser)
    return all(
        style_of(part) in exact for _, part in parts(found) if part["type"] in SCHEMA_FORMATS
    )


def tool_parser_styles(tool_parser: str | None) -> frozenset[str] | None:
    """How the calls of vLLM's tool parser called ``tool_parser`` write arguments; ``None``
    when there is none or it builds no structural tag (vLLM then constrains required and
    named calls with a JSON schema, which we take over as ``json_schema``)."""
    if not tool_parser:
        return None
    from vllm.tool_parsers import ToolParserManager

    try:
        model = ToolParserManager.get_tool_parser(tool_parser).structural_tag_model
    except Exception:  # a plugin parser we cannot look up: admission still checks
        return None
    return tool_call_styles(model) if model else None


@functools.cache
def tool_call_styles(structural_tag_model: str) -> frozenset[str]:
    """How a vLLM tool parser's calls write arguments (``json``, ``qwen_xml`` ...), read off
    the structural tag vLLM builds for a one-tool request."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    from constrained.grammars.structural_tag import SCHEMA_FORMATS, parse_structural_tag, parts
    from constrained.grammars.xgrammar_backend import style_of

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tag = get_model_structural_tag(
        structural_tag_model, [ChatCompletionToolsParam.model_validate(tool)], "required",
        False, strict_level=ToolStrictLevel.PARAMETER,
    )  # fmt: skip
    found = parse_structural_tag(tag.model_dump(mode="json"))["format"]
    return frozenset(style_of(p) for _, p in parts(found) if p["type"] in SCHEMA_FORMATS)


def check_tools(
    body: dict[str, Any], strict_level: str = "parameter", tool_parser: str | None = None
) -> None:
    """Refuse, naming ``tools``, a tool whose parameters use a JSON-schema keyword the
    structural tag's backend would not enforce (or not exactly rewrite) in the call style of
    the server's ``tool_parser`` (``None``: none, nothing to check; a style we leave to
    vLLM: nothing to check). ``strict_level``: the server's ``--tool-strict-level``; below
    ``parameter`` only ``strict`` tools count.

    Raises:
        OptionError: naming ``tools``, the tool and the keyword.
    """
    from constrained.errors import GrammarError
    from constrained.grammars.xgrammar_backend import check_tool_parameters

    styles = tool_parser_styles(tool_parser)
    if not styles or not styles <= exact_styles(tool_parser):
        return  # no tool parser (vLLM answers), or vLLM's own structured outputs enforce it
    if not calls_tools(body) or not isinstance(body.get("tools"), list):
        return
    for index, tool in enumerate(body["tools"]):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("parameters"), dict):
            continue  # vLLM's request model answers malformed tools
        if strict_level != "parameter" and function.get("strict") is not True:
            continue  # its arguments are not constrained to its parameters
        try:
            for style in styles:
                check_tool_parameters(function["parameters"], style)
        except GrammarError as exc:
            name = function.get("name", index)
            raise OptionError("tools", f"the parameters of tool {name!r}: {exc}") from None
