"""OpenAI-shaped structured output, routed to our processors on our launcher.

A client that never heard of ``vllm_xargs`` asks for structured output with OpenAI's
``response_format`` (``client.chat.completions.parse(..., response_format=Person)`` sends
``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}``) or
with vLLM's ``structured_outputs`` request field. ``route(body)`` rewrites such a request
body so that the constraint reaches our grammar processor as ``vllm_xargs`` instead of vLLM's
built-in structured outputs; the server middleware (``stream_checks``) calls it before vLLM
reads the body. The same keys, checks and errors as ``vllm_xargs`` then apply.

- ``response_format: {"type": "json_schema", "json_schema": {"schema": S}}``:
  ``json_schema: S``;
- ``response_format: {"type": "json_object"}``: ``json_object: true``;
- ``structured_outputs: {"json": S}``: ``json_schema: S``; its ``regex``, ``grammar``,
  ``choice``, ``json_object`` and ``disable_additional_properties``: the option of that name.

``response_format: {"type": "text"}`` is left alone. A ``structured_outputs`` with a field we
do not take (``structural_tag``, ``whitespace_pattern``, ...) is left to vLLM whole. Turned off
with the launcher's ``--no-constrained-routing`` (``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=0``).
"""

from __future__ import annotations

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
}
# Fields that say "no change" at their default value (vLLM sends them with every request).
_NEUTRAL = {"disable_fallback": False, "disable_any_whitespace": False}


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
    raise OptionError(
        "response_format", f'type must be "text", "json_object" or "json_schema", got {kind!r}'
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
