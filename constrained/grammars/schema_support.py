"""Which JSON-schema keywords each backend enforces, so none is silently dropped.

llguidance refuses every keyword it does not implement, by name, so it checks itself.
xgrammar and outlines-core ignore what they do not implement (``not``, ``uniqueItems``,
several ``allOf`` branches...); for them a schema may only use the keywords below, in the
combinations below, or it is refused with the keyword and where it is.
"""

from __future__ import annotations

from collections.abc import Iterator
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

_SHARED = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "anyOf", "allOf", "oneOf", "$ref", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "format",
}  # fmt: skip

# What each backend enforces (with the extra rules in ``_combination_problem``).
ENFORCED: dict[str, frozenset[str]] = {
    "xgrammar": frozenset(
        _SHARED
        | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
        | {"minProperties", "maxProperties"}
    ),
    "outlines": frozenset(_SHARED),
}

FORMATS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset(
        {"date", "time", "date-time", "email", "ipv4", "ipv6", "uuid", "uri", "hostname"}
    ),
    "outlines": frozenset({"date", "time", "date-time", "uuid", "email", "uri"}),
}

_TYPE_KEYWORDS = {
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties", "minProperties",
               "maxProperties"},
}  # fmt: skip
_TYPE_OF_KEYWORD = {kw: t for t, kws in _TYPE_KEYWORDS.items() for kw in kws}


def iter_subschemas(schema: Any, path: str = "#") -> Iterator[tuple[str, dict]]:
    """Every (JSON pointer, schema object) in ``schema``, itself included."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas", "dependencies"):  # fmt: skip
            if isinstance(value, dict):
                for name, sub in value.items():
                    yield from iter_subschemas(sub, f"{path}/{key}/{_escape(name)}")
        elif key in ("allOf", "anyOf", "oneOf", "prefixItems") or (
            key in ("items", "additionalItems") and isinstance(value, list)
        ):
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from iter_subschemas(sub, f"{path}/{key}/{i}")
        elif key in ("additionalProperties", "items", "additionalItems", "contains",
                     "propertyNames", "not", "if", "then", "else", "unevaluatedItems",
                     "unevaluatedProperties", "contentSchema"):  # fmt: skip
            yield from iter_subschemas(value, f"{path}/{key}")


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def unsupported_keyword(schema: Any, backend: str) -> tuple[str, str] | None:
    """The first (keyword, JSON pointer) that ``backend`` would not enforce, else ``None``."""
    if backend not in ENFORCED:
        return None
    enforced, formats = ENFORCED[backend], FORMATS[backend]
    for path, sub in iter_subschemas(schema):
        for key in sub:
            if key in VALIDATION_KEYWORDS and key not in enforced:
                return key, path
        problem = _combination_problem(sub, backend, formats)
        if problem:
            return problem, path
    return None


def _combination_problem(sub: dict, backend: str, formats: frozenset[str]) -> str | None:
    """A keyword the backend knows but would not enforce in this schema object."""
    for key in ("allOf", "oneOf"):  # several branches: xgrammar/outlines check only one / any
        if isinstance(sub.get(key), list) and len(sub[key]) > 1:
            return key
    if "$ref" in sub and any(k in VALIDATION_KEYWORDS for k in sub if k != "$ref"):
        return "$ref"  # siblings of $ref are dropped
    if "format" in sub and sub["format"] not in formats:
        return "format"
    if ("pattern" in sub or "format" in sub) and ("minLength" in sub or "maxLength" in sub):
        return "minLength" if "minLength" in sub else "maxLength"
    if "pattern" in sub and "format" in sub:
        return "pattern"
    multiple = sub.get("multipleOf")
    if multiple is not None and (not isinstance(multiple, int) or sub.get("type") != "integer"):
        return "multipleOf"
    if isinstance(sub.get("items"), list):  # draft-4 tuple form
        return "items"
    if backend == "outlines" and isinstance(sub.get("additionalProperties"), dict):
        return "additionalProperties"
    declared = sub.get("type")
    declared = set(declared) if isinstance(declared, list) else {declared}
    if "integer" in declared:
        declared.add("number")
    for key in sub:  # type-specific keywords without their type are ignored
        wanted = _TYPE_OF_KEYWORD.get(key)
        if wanted and wanted not in declared:
            return key
    return None
