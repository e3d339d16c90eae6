"""Structural tags: free text, tags, and JSON valid against a schema inside them.

A structural tag describes an output made of parts: free text until a trigger, then a tag's
``begin``, its content (JSON valid against a schema, in JSON or a model's XML parameter
style; a regex; a grammar ...) and its ``end``. vLLM builds one per tool parser for tool
calls and accepts them in ``structured_outputs.structural_tag``; llguidance compiles those of
text and JSON, xgrammar every one (``grammars/*_backend.py``). Two
spellings are read, both as vLLM reads them:

- vLLM's first one: ``{"type": "structural_tag", "structures": [{"begin": ..., "schema":
  {...}, "end": ...}], "triggers": [...]}`` (free text; a trigger starts the structure whose
  ``begin`` it prefixes);
- xgrammar's: ``{"type": "structural_tag", "format": {...}}`` (``triggered_tags``,
  ``tags_with_separator``, ``sequence``, ``or``, ``tag``, ``json_schema`` ...).

This module is the format only: parsing (shape checked by xgrammar's own models), the JSON
schemas inside (``map_schemas``: the backend checks and rewrites each as it does a
``json_schema``), and the literal text that delimits parts (``literals``: special tokens
spelled there may be written as themselves). Token-level parts (token ids as triggers or
begins) are refused: they are vocabulary-specific and no vLLM tool parser uses them.

Example::

    tag = parse_structural_tag('{"type": "structural_tag", "triggers": ["<tool_call>"], '
                               '"structures": [{"begin": "<tool_call>", "schema": {}, '
                               '"end": "</tool_call>"}]}')
    tag["format"]["type"]          # 'triggered_tags'
    literals(tag)                  # {'<tool_call>', '</tool_call>'}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from constrained.errors import GrammarError

if TYPE_CHECKING:
    from constrained.grammars.spec import GrammarSpec

# Parts that name token ids or token strings instead of text.
TOKEN_FORMATS = frozenset(
    {"token", "token_triggered_tags", "exclude_token", "any_tokens", "token_dispatch"}
)
# Parts whose ``json_schema`` is a JSON schema the output must satisfy.
SCHEMA_FORMATS = frozenset({"json_schema", "qwen_xml_parameter"})


def parse_structural_tag(value: Any) -> dict[str, Any]:
    """The structural tag as xgrammar's JSON (the first spelling converted), checked.

    Raises:
        ValueError: not JSON, not a structural tag, a malformed part (xgrammar's message),
            or a token-level part.
    """
    from pydantic import ValidationError
    from xgrammar import structural_tag as xst

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
        except RecursionError:
            raise ValueError("nested too deeply") from None
    if not isinstance(value, dict) or value.get("type") != "structural_tag":
        raise ValueError('must be a JSON object with "type": "structural_tag"')
    try:
        if "format" in value:
            tag = xst.StructuralTag.model_validate(value)
        elif "structures" in value or "triggers" in value:
            extra = set(value) - {"type", "structures", "triggers"}
            if extra:
                raise ValueError(f"unknown key {sorted(extra)[0]!r}")
            items = [xst.StructuralTagItem.model_validate(s) for s in value.get("structures", [])]
            if not items:
                raise ValueError('"structures" must list at least one structure')
            triggers = value.get("triggers")
            if not isinstance(triggers, list) or not triggers:
                raise ValueError('"triggers" must list at least one trigger')
            for item in items:
                if not any(item.begin.startswith(t) for t in triggers):
                    raise ValueError(f"no trigger starts the begin {item.begin!r}")
            tag = xst.StructuralTag.from_legacy_structural_tag(items, triggers)
        else:
            raise ValueError('needs "format", or "structures" and "triggers"')
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/".join(str(p) for p in first["loc"])
        raise ValueError(f"malformed at {where or '(root)'}: {first['msg']}") from None
    parsed = tag.model_dump(mode="json")
    for path, node in parts(parsed["format"], "/format"):
        if node.get("type") in TOKEN_FORMATS:
            raise ValueError(
                f"token-level part '{node['type']}' (at {path}) is not supported: write "
                "triggers, begins and ends as text"
            )
        if isinstance(node.get("begin"), dict) or isinstance(node.get("end"), dict):
            raise ValueError(f"token-level begin or end (at {path}) is not supported")
        for key in _LISTS.get(node.get("type"), ()):
            if node.get(key) == []:  # xgrammar refuses them when it compiles: refused here
                raise ValueError(f'"{key}" (at {path}) must list at least one')
    return parsed


# The parts' lists that may not be empty (an empty choice matches nothing, an empty list of
# ends would leave a tag unclosed).
_LISTS = {"sequence": ("elements",), "or": ("elements",), "tags_with_separator": ("tags",),
          "triggered_tags": ("tags", "triggers"), "tag": ("end",)}  # fmt: skip


def check_json_part(node: dict[str, Any], where: str, spec: GrammarSpec, backend: str) -> None:
    """What every backend refuses in a JSON part: ``any_order`` or ``excludes``, and its own
    ``max_whitespace_cnt`` where the spec's whitespace would not keep it (compact JSON, or a
    ``max_whitespace`` within it, keeps it): never dropped.

    Raises:
        GrammarError: ``backend``'s, naming the part's place (and both caps).
    """
    if node.get("any_order") or node.get("excludes"):
        raise GrammarError(backend, f"a JSON part with any_order or excludes (at {where})")
    cap = node.get("max_whitespace_cnt")
    compact = spec.whitespace == "compact" or spec.max_whitespace == 0
    if cap is not None and not compact and spec.max_whitespace > cap:
        raise GrammarError(
            backend,
            f"the part at {where} allows at most {cap} whitespace characters in a row, "
            f"fewer than max_whitespace ({spec.max_whitespace}): give max_whitespace <= {cap}",
        )


def checked_structural_tag(value: Any, check: bool = True) -> str:
    """``value`` parsed (``parse_structural_tag``), every schema inside checked as a
    ``json_schema`` is (``schema_text``; not when ``check`` is false: checked before), as
    canonical JSON text.

    Raises:
        ValueError: what is wrong, and where.
    """
    from constrained.schema.user_input import schema_text

    tag = parse_structural_tag(value)

    def check_schema(schema: Any, where: str, node: dict[str, Any]) -> dict[str, Any]:
        try:
            schema_text(schema)
        except ValueError as exc:
            raise ValueError(f"the schema at {where}: {exc}") from None
        return node

    if check:
        map_schemas(tag, check_schema)
    return json.dumps(tag, ensure_ascii=False)  # key order kept: properties come in it


def map_schemas(
    tag: dict[str, Any], schema: Callable[[Any, str, dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """A copy of ``tag`` with every schema part replaced by ``schema(json_schema, path,
    part)``, which returns the part to put in its place (another schema, or a grammar)."""
    copied = json.loads(json.dumps(tag))

    def visit(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            if node.get("type") in SCHEMA_FORMATS and "json_schema" in node:
                return schema(node["json_schema"], f"{path}/json_schema", node)
            return {k: visit(v, f"{path}/{k}") for k, v in node.items()}
        if isinstance(node, list):
            return [visit(v, f"{path}/{i}") for i, v in enumerate(node)]
        return node

    copied["format"] = visit(copied["format"], "/format")
    return copied


def literals(tag: dict[str, Any]) -> frozenset[str]:
    """The text the tag writes as is: begins, ends, triggers, separators, constant strings."""
    found: set[str] = set()
    for _, node in parts(tag["format"], "/format"):
        for key in ("begin", "end", "triggers", "separator", "value"):
            value = node.get(key)
            if key == "value" and node.get("type") != "const_string":
                continue
            values = value if isinstance(value, list) else [value]
            found.update(v for v in values if isinstance(v, str) and v)
    return frozenset(found)


def json_openers(source: str) -> tuple[bytes, ...]:
    """The ``begin`` of each tag whose content is a JSON value (``json_schema``), as UTF-8:
    where the finite-number rule starts reading JSON (``grammars/finite_matcher.py``)."""
    tag = parse_structural_tag(source)
    found = {
        node["begin"].encode()
        for _, node in parts(tag["format"], "/format")
        if node.get("type") == "tag"
        and isinstance(node.get("content"), dict)
        and node["content"].get("type") == "json_schema"
        and isinstance(node.get("begin"), str)
        and node["begin"]
    }
    return tuple(sorted(found))


def parts(node: Any, path: str = "/format") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every part (an object with a ``type``) of a format, with its path; not inside
    schemas, whose objects are JSON-schema keywords."""
    stack = [(path, node)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, dict):
            if "type" in item:
                yield at, item
            for key, value in item.items():
                if key != "json_schema":
                    stack.append((f"{at}/{key}", value))
        elif isinstance(item, list):
            stack.extend((f"{at}/{i}", v) for i, v in enumerate(item))
