"""Walking a JSON schema: its subschemas, local ``$ref`` pointers, keyword and type helpers.

Plain JSON Schema (draft 4 to 2020-12), no backend and no vLLM: what every other module of
``constrained.grammars`` needs to look inside a schema. Pointers are JSON pointers written as
URI fragments (``#/properties/a~1b/items``).

Example::

    >>> [path for path, _ in iter_subschemas({"items": {"type": "integer"}})]
    ['#', '#/items']
    >>> resolve_pointer({"$defs": {"a": {"type": "string"}}}, "#/$defs/a")
    {'type': 'string'}
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Keywords that only describe (no validation meaning): allowed everywhere.
ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$vocabulary", "$comment",
        "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
        "contentEncoding", "contentMediaType", "$defs", "definitions",
    }
)  # fmt: skip

# Every validation keyword of JSON Schema (draft 4 to 2020-12). Other keys are not keywords
# (``x-...`` extensions, typos) and have no meaning to a validator either.
VALIDATION_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "items",
        "prefixItems", "additionalItems", "unevaluatedItems", "contains", "minContains",
        "maxContains", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties",
        "required", "properties", "patternProperties", "additionalProperties",
        "unevaluatedProperties", "propertyNames", "dependentRequired", "dependentSchemas",
        "dependencies", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
        "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "contentSchema",
    }
)  # fmt: skip

# The formats JSON Schema defines (draft 4 to 2020-12). Any other ``format`` value asserts
# nothing in any validator.
STANDARD_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid",
        "uri-template", "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip

# Keywords whose value maps names to subschemas / holds a list of subschemas / is one.
_NAMED_SUBSCHEMAS = (
    "properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
    "dependencies",
)  # fmt: skip
_LISTED_SUBSCHEMAS = ("allOf", "anyOf", "oneOf", "prefixItems")
_ONE_SUBSCHEMA = (
    "additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not",
    "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
)  # fmt: skip


def iter_subschemas(schema: Any, path: str = "#") -> Iterator[tuple[str, dict]]:
    """Every (JSON pointer, schema object) in ``schema``, itself included."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in _NAMED_SUBSCHEMAS:
            if isinstance(value, dict):
                for name, sub in value.items():
                    yield from iter_subschemas(sub, f"{path}/{key}/{escape_pointer(name)}")
        elif key in _LISTED_SUBSCHEMAS or (
            key in ("items", "additionalItems") and isinstance(value, list)
        ):
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from iter_subschemas(sub, f"{path}/{key}/{i}")
        elif key in _ONE_SUBSCHEMA:
            yield from iter_subschemas(value, f"{path}/{key}")


def map_subschemas(schema: dict, path: str, fn: Callable[[Any, str], Any]) -> None:
    """Replace each direct subschema ``sub`` of ``schema`` by ``fn(sub, its pointer)``."""
    for key, value in schema.items():
        if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                value[name] = fn(sub, f"{path}/{key}/{escape_pointer(name)}")
        elif (key in _LISTED_SUBSCHEMAS or key in ("items", "additionalItems")) and isinstance(
            value, list
        ):
            value[:] = [fn(sub, f"{path}/{key}/{i}") for i, sub in enumerate(value)]
        elif key in _ONE_SUBSCHEMA and not isinstance(value, list):
            schema[key] = fn(value, f"{path}/{key}")


def local_refs(value: Any) -> Iterator[tuple[Mapping, str]]:
    """Every (object, its ``$ref``) in a JSON value whose ``$ref`` is local (``#...``),
    wherever it sits (inside ``$defs``, unknown keywords, ``const`` values alike)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                yield node, ref
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def local_refs_at(value: Any, path: str = "#") -> Iterator[tuple[str, str]]:
    """``local_refs`` with where each sits: (pointer to the object holding the ``$ref``,
    the ``$ref``)."""
    stack = [(path, value)]
    while stack:
        at, node = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                yield at, ref
            stack.extend((f"{at}/{escape_pointer(k)}", v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{at}/{i}", v) for i, v in enumerate(node))


def escape_pointer(name: str) -> str:
    """``name`` as one JSON-pointer segment (``~`` and ``/`` escaped)."""
    return str(name).replace("~", "~0").replace("/", "~1")


def resolve_pointer(root: Any, ref: str) -> Any:
    """The value a local ``$ref`` (``#`` or ``#/a/b``) points at in ``root``, else ``None``."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in urllib.parse.unquote(ref[2:]).split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def reachable_subschemas(
    schema: Any, root: Any = None, path: str = "#"
) -> Iterator[tuple[str, dict]]:
    """``iter_subschemas`` plus what local ``$ref``s point at outside of it (OpenAPI-style
    ``#/components/...``), each schema object once. ``root``: the document ``schema`` (at
    ``path``) is part of, which ``$ref``s resolve against (``schema`` itself by default)."""
    root = schema if root is None else root
    seen: set[int] = set()
    pending = [(path, schema)]
    while pending:
        start, node = pending.pop()
        for path, sub in iter_subschemas(node, start):
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            yield path, sub
            ref = sub.get("$ref")
            if isinstance(ref, str):
                target = resolve_pointer(root, ref)
                if isinstance(target, dict) and id(target) not in seen:
                    pending.append((ref, target))


def nested_resources(schema: Any) -> Iterator[tuple[str, dict]]:
    """Subschemas (not the root) that start a new resource: ``$id`` (or draft-4 ``id``) with
    a URI, against which the ``$ref``s inside them resolve."""
    for path, sub in reachable_subschemas(schema):
        if path == "#":
            continue
        for key in ("$id", "id"):
            value = sub.get(key)
            if isinstance(value, str) and not value.startswith("#"):
                yield path, sub
                break


def is_unknown_format(value: Any) -> bool:
    """A ``format`` name JSON Schema does not define (``int32``, ``path``...): asserts nothing."""
    return isinstance(value, str) and value not in STANDARD_FORMATS


def type_names(value: Any) -> set[str] | None:
    """The instance types a ``type`` value allows (``number`` includes ``integer``); ``None``
    when it is not a type name or a list of them."""
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) for n in names):
        return None
    types = set(names)
    if "number" in types:
        types.add("integer")
    return types


def json_type(value: Any) -> str:
    """The JSON Schema type of a (parsed) JSON value; ``1.0`` is an ``integer``."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def same_json(x: Any, y: Any) -> bool:
    """JSON equality (``1 == 1.0``, ``true != 1``)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return x is y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same_json(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(same_json(a, b) for a, b in zip(x, y, strict=True))
    return (type(x) is type(y) and x == y) or (is_number(x) and is_number(y) and x == y)


def is_int(value: Any) -> bool:
    """A JSON integer as parsed (``True`` is no integer)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number as parsed (``True`` is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
