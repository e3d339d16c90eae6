r"""Which JSON-schema keywords each backend enforces, so none is silently dropped.

llguidance refuses every keyword it does not implement, by name, so it checks itself (the
suite and MaskBench found nothing it accepts wrongly). xgrammar and outlines-core ignore what
they do not implement (``not``, ``uniqueItems``, several ``allOf`` branches, ``required`` names
missing from ``properties``, every keyword beside an ``anyOf`` or ``enum``, ``$ref`` to anything
but a local JSON pointer...); for them a schema may only use the keywords below, in the
combinations below, or it is refused with the keyword and where it is.

Calibrated against the JSON-Schema-Test-Suite (draft 2020-12, with ``optional/`` and
``optional/format/``), MaskBench and targeted probes: every rule stops a backend from
accepting an instance the schema forbids (``benchmarks/maskbench.py``,
``tests/test_schema_suite.py``). ``format`` is an assertion; unknown formats (``int32``,
``path``...) assert nothing, as in every validator. ``pattern`` means ECMA-262, except for the
few code points where Python's ``re`` (jsonschema's) and every backend agree against it:
``.`` matching U+000D, U+2028, U+2029 and ``\s`` matching U+0085 but not U+FEFF.
"""

from __future__ import annotations

import re
import urllib.parse
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
        | {"minProperties", "maxProperties", "patternProperties"}
    ),
    # outlines-core joins ``prefixItems`` regexes without grouping them: ``[{}]`` matches any
    # text that starts with "[true".
    "outlines": frozenset(_SHARED - {"prefixItems"}),
}

# The formats JSON Schema defines (draft 4 to 2020-12). Any other ``format`` value asserts
# nothing in any validator, so a backend that ignores it (or refuses it itself) is right.
STANDARD_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid",
        "uri-template", "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip

# The standard formats each backend checks. Left out after the format tests: xgrammar's
# date / date-time accept 2020-02-30 and 2020-04-31, its hostname labels over 63 characters,
# its ipv6 "::ffff:192.168.0.01"; outlines' date accepts 2020-02-30 and non-ASCII digits, its
# time and date-time (found by MaskBench) a time without offset, its uri
# "https://example.org/foobar\\.txt" and lone "%".
# (No backend checks leap years, leap seconds or IDNA rules; see tests/test_schema_suite.py.)
FORMATS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset({"time", "email", "ipv4", "uuid", "uri"}),
    "outlines": frozenset({"uuid", "email"}),
}

_TYPE_KEYWORDS = {
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties", "minProperties",
               "maxProperties"},
}  # fmt: skip
_TYPE_OF_KEYWORD = {kw: t for t, kws in _TYPE_KEYWORDS.items() for kw in kws}
_EXCLUSIVE = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # a name JSON writes with an escape
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")

# Regex features whose meaning differs from ECMA-262 (what JSON Schema specifies), or that
# the backend drops. xgrammar: ``\s`` is ASCII white space only (ECMA adds U+00A0, U+3000...),
# lookarounds are ignored. outlines-core: ``\d`` ``\w`` ``\b`` are Unicode classes (ECMA:
# ASCII digits and word characters).
_ESCAPE = r"(?<!\\)(?:\\\\)*\\"  # an unescaped backslash
_LOOKAROUND = re.compile(r"(?<!\\)(?:\\\\)*\(\?<?[=!]")
_REGEX_PROBLEMS: dict[str, re.Pattern[str]] = {
    "xgrammar": re.compile(_ESCAPE + r"[sS]"),
    "outlines": re.compile(_ESCAPE + r"[dDwWbB]"),
}


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


def _reachable(schema: Any) -> Iterator[tuple[str, dict]]:
    """``iter_subschemas`` plus what local ``$ref``s point at outside of it (OpenAPI-style
    ``#/components/...``), each schema object once."""
    seen: set[int] = set()
    pending = [("#", schema)]
    while pending:
        start, node = pending.pop()
        for path, sub in iter_subschemas(node, start):
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            yield path, sub
            ref = sub.get("$ref")
            if isinstance(ref, str):
                target = resolve_pointer(schema, ref)
                if isinstance(target, dict) and id(target) not in seen:
                    pending.append((ref, target))


def _nested_resources(schema: Any) -> Iterator[tuple[str, dict]]:
    """Subschemas (not the root) that start a new resource: ``$id`` (or draft-4 ``id``) with
    a URI, against which the ``$ref``s inside them resolve."""
    for path, sub in _reachable(schema):
        if path == "#":
            continue
        for key in ("$id", "id"):
            value = sub.get(key)
            if isinstance(value, str) and not value.startswith("#"):
                yield path, sub
                break


def unsupported_keyword(schema: Any, backend: str) -> tuple[str, str] | None:
    """The first (keyword, JSON pointer) that ``backend`` would not enforce, else ``None``."""
    if backend not in ENFORCED:
        return None
    enforced = ENFORCED[backend]
    for path, sub in _nested_resources(schema):
        if any("$ref" in inner for _, inner in iter_subschemas(sub)):
            return "$id", path  # its "$ref"s resolve against the "$id", not the document
    for path, sub in _reachable(schema):
        for key in sub:
            if key in VALIDATION_KEYWORDS and key not in enforced and not _vacuous(key, sub):
                return key, path
        problem = _combination_problem(sub, backend, schema)
        if problem:
            return problem, path
    return None


def _vacuous(key: str, sub: dict) -> bool:
    """A keyword that constrains nothing here (the spec says to ignore it)."""
    if key == "additionalItems":
        return not isinstance(sub.get("items"), list)
    if key in ("then", "else"):
        return "if" not in sub
    if key in ("minContains", "maxContains"):
        return "contains" not in sub
    if key == "uniqueItems":
        return sub[key] is False
    return False


def _regex_problem(pattern: Any, backend: str) -> bool:
    if not isinstance(pattern, str):
        return False
    if _LOOKAROUND.search(pattern):
        return True
    return bool(_REGEX_PROBLEMS[backend].search(pattern))


def _combination_problem(sub: dict, backend: str, root: Any) -> str | None:
    """A keyword the backend knows but would not enforce in this schema object."""
    for check in (_exclusive_problem, _ref_problem, _string_problem, _number_problem,
                  _container_problem, _untyped_keyword):  # fmt: skip
        problem = check(sub, backend, root)
        if problem:
            return problem
    return None


def _exclusive_problem(sub: dict, backend: str, root: Any) -> str | None:
    """Both backends build a schema object from ONE of ``$ref``, ``const``, ``enum``,
    ``anyOf``, ``oneOf``, ``allOf`` (or ``properties`` for outlines) and drop the rest:
    ``{"type": "object", "properties": ..., "anyOf": [...]}`` checks only the ``anyOf``.

    Allowed: a ``type`` the other keyword implies anyway (``{"type": "string", "enum":
    ["a", "b"]}``, or ``anyOf`` branches that each declare a type within it).
    """
    present = [k for k in _EXCLUSIVE if k in sub]
    if not present:
        return None
    keyword = present[0]
    for key in sub:
        if key == keyword or key not in VALIDATION_KEYWORDS:
            continue
        if key == "type" and _implied_type(sub, keyword):
            continue
        return keyword
    branches = sub[keyword]
    if keyword == "allOf" and isinstance(branches, list) and len(branches) > 1:
        return keyword  # only one branch would be checked
    if keyword == "oneOf" and isinstance(branches, list) and not _disjoint(branches):
        return keyword  # checked as anyOf: right only when no value matches two branches
    return None


def _disjoint(branches: list) -> bool:
    """No value can match two of ``branches``: each allows only values of its own types or
    its own ``const``/``enum`` values, or each requires a property whose allowed values no
    other branch allows (a discriminator)."""
    if len(branches) < 2:
        return True
    sets = [_value_set(b) for b in branches]
    if all(s is not None for s in sets) and _pairwise_disjoint(sets):
        return True
    return any(
        _pairwise_disjoint([_discriminated(b, key) for b in branches])
        for key in _required_names(branches[0])
    )


def _value_set(branch: Any) -> tuple[frozenset[str], list] | None:
    """(types, values) that bound what a branch allows: its ``const``/``enum`` values, else
    its ``type``s (its other keywords only narrow that down)."""
    if not isinstance(branch, dict):
        return None
    if "const" in branch:
        return frozenset(), [branch["const"]]
    if "enum" in branch:
        return (frozenset(), list(branch["enum"])) if isinstance(branch["enum"], list) else None
    types = _types(branch.get("type")) if "type" in branch else None
    return (frozenset(types), []) if types else None


def _discriminated(branch: Any, key: str) -> tuple[frozenset[str], list] | None:
    """The values ``branch`` allows for the property ``key`` it requires, when finite."""
    if not isinstance(branch, dict) or branch.get("type") != "object":
        return None
    if key not in _required_names(branch):
        return None
    prop = (branch.get("properties") or {}).get(key)
    found = _value_set(prop)
    return found if found is not None and not found[0] else None


def _required_names(branch: Any) -> list[str]:
    required = branch.get("required") if isinstance(branch, dict) else None
    return [n for n in required if isinstance(n, str)] if isinstance(required, list) else []


def _pairwise_disjoint(sets: list[tuple[frozenset[str], list] | None]) -> bool:
    if any(s is None for s in sets):
        return False
    for i, first in enumerate(sets):
        for second in sets[i + 1 :]:
            if _overlap(first, second):  # type: ignore[arg-type]
                return False
    return True


def _overlap(a: tuple[frozenset[str], list], b: tuple[frozenset[str], list]) -> bool:
    types_a, values_a = a
    types_b, values_b = b
    if types_a & types_b:
        return True
    if any(_json_type(v) in types_b for v in values_a):
        return True
    if any(_json_type(v) in types_a for v in values_b):
        return True
    return any(_same_json(x, y) for x in values_a for y in values_b)


def _same_json(x: Any, y: Any) -> bool:
    """JSON equality (``1 == 1.0``, ``true != 1``)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return x is y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same_json(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same_json(a, b) for a, b in zip(x, y, strict=True))
    return (type(x) is type(y) and x == y) or (_is_number(x) and _is_number(y) and x == y)


def _implied_type(sub: dict, keyword: str) -> bool:
    """Every value ``keyword`` allows already has one of ``sub["type"]``'s types."""
    types = _types(sub.get("type"))
    if types is None:
        return False
    if keyword == "const":
        return _json_type(sub["const"]) in types
    if keyword == "enum":
        values = sub["enum"]
        return isinstance(values, list) and all(_json_type(v) in types for v in values)
    if keyword in ("anyOf", "oneOf", "allOf"):
        branches = sub[keyword]
        return isinstance(branches, list) and all(
            isinstance(b, dict) and (_types(b.get("type")) or {"?"}) <= types for b in branches
        )
    return False


def _types(value: Any) -> set[str] | None:
    """The instance types a ``type`` value allows (``number`` includes ``integer``)."""
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) for n in names):
        return None
    types = set(names)
    if "number" in types:
        types.add("integer")
    return types


def _json_type(value: Any) -> str:
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


def _ref_problem(sub: dict, backend: str, root: Any) -> str | None:
    if "$ref" not in sub:
        return None
    ref = sub["$ref"]
    if not isinstance(ref, str) or resolve_pointer(root, ref) is None:
        return "$ref"  # remote, "#anchor" or dangling: resolved to "anything"
    return None


def _string_problem(sub: dict, backend: str, root: Any) -> str | None:
    fmt = sub.get("format")
    known = "format" in sub and not _unknown_format(fmt)
    if known and not (isinstance(fmt, str) and fmt in FORMATS[backend]):
        return "format"
    if ("pattern" in sub or known) and ("minLength" in sub or "maxLength" in sub):
        return "minLength" if "minLength" in sub else "maxLength"  # only the regex is kept
    if "pattern" in sub and known:
        return "pattern"
    if _regex_problem(sub.get("pattern"), backend):
        return "pattern"
    return None


def _number_problem(sub: dict, backend: str, root: Any) -> str | None:
    """xgrammar checks ``multipleOf`` of integers only: up to 1024, and either unbounded or
    bounded on both sides at most 10,000 apart (else it warns and drops it)."""
    if "multipleOf" not in sub:
        return None
    multiple = sub["multipleOf"]
    if not _is_int(multiple) or not 0 < multiple <= 1024 or sub.get("type") != "integer":
        return "multipleOf"
    low = [sub[k] for k in ("minimum", "exclusiveMinimum") if k in sub]
    high = [sub[k] for k in ("maximum", "exclusiveMaximum") if k in sub]
    if not low and not high:
        return None
    if not (low and high) or not all(_is_number(v) for v in low + high):
        return "multipleOf"
    return "multipleOf" if min(high) - max(low) > 10_000 else None


def _container_problem(sub: dict, backend: str, root: Any) -> str | None:
    for key in _COUNTS:  # 2.0 is a valid bound, but outlines ignores it
        if key in sub and not _is_int(sub[key]):
            return key
    if isinstance(sub.get("items"), list):  # draft-4 tuple form
        return "items"
    required = sub.get("required")
    properties = sub.get("properties")
    if isinstance(properties, dict) and any(_NEEDS_ESCAPE.search(n) for n in properties):
        return "properties"  # xgrammar matches such a key unescaped, then as an extra key
    if isinstance(required, list) and any(
        name not in (properties if isinstance(properties, dict) else {}) for name in required
    ):
        return "required"  # names not in "properties" are not required at all
    if backend == "outlines" and isinstance(sub.get("additionalProperties"), dict):
        return "additionalProperties"
    if "patternProperties" in sub and not _closed_pattern_properties(sub):
        return "patternProperties"
    return None


def _closed_pattern_properties(sub: dict) -> bool:
    """xgrammar enforces ``patternProperties`` only as the sole way to add keys: one pattern,
    ``additionalProperties: false``, and no name in ``properties`` that the pattern matches
    too (such a key must satisfy both schemas; xgrammar checks one)."""
    patterns = sub["patternProperties"]
    if (
        not isinstance(patterns, dict)
        or len(patterns) > 1
        or sub.get("additionalProperties") is not False
    ):
        return False
    names = sub.get("properties") or {}
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except re.error:
            return False
        if _regex_problem(pattern, "xgrammar") or any(compiled.search(n) for n in names):
            return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _untyped_keyword(sub: dict, backend: str, root: Any) -> str | None:
    """A type-specific keyword in a schema without ``type``: ignored there, except that
    xgrammar reads a schema with ``properties`` / ``additionalProperties`` as an object and
    one with ``items`` / ``prefixItems`` as an array (stricter: other types are refused).

    With a ``type`` it is enforced, or vacuous (``minLength`` of an integer).
    """
    if "type" in sub:
        return None
    implied: set[str] = set()
    if backend == "xgrammar":
        if "properties" in sub or "additionalProperties" in sub:
            implied.add("object")
        elif "items" in sub or "prefixItems" in sub:
            implied.add("array")
    for key in sub:
        wanted = _TYPE_OF_KEYWORD.get(key)
        if wanted and wanted not in implied and not (key == "format" and _unknown_format(sub[key])):
            return key
    return None


def _unknown_format(value: Any) -> bool:
    return isinstance(value, str) and value not in STANDARD_FORMATS
