r"""Refusing schemas a backend would enforce only in part: an allow-list per backend.

Some backends (xgrammar, outlines-core) ignore what they do not implement (``not``,
``uniqueItems``, several ``allOf`` branches, ``required`` names missing from ``properties``,
every keyword beside an ``anyOf`` or ``enum``, ``$ref`` to anything but a local JSON pointer...)
and compile the rest, so a schema may only use the keywords such a backend lists, in the
combinations below, or it is refused with the keyword and where it is. Each of those backends
states its own ``AllowList`` (keywords, formats, regex escapes, two yes/no rules) in its module;
the combination rules here hold for all of them.

Calibrated against the JSON-Schema-Test-Suite (draft 2020-12, with ``optional/`` and
``optional/format/``), MaskBench and targeted probes: every rule stops a backend from
accepting an instance the schema forbids (``benchmarks/maskbench.py``,
``tests/test_schema_suite.py``). ``format`` is an assertion; unknown formats (``int32``,
``path``...) assert nothing, as in every validator. ``pattern`` means ECMA-262, except for the
few code points where Python's ``re`` (jsonschema's) and every backend agree against it:
``.`` matching U+000D, U+2028, U+2029 and ``\s`` matching U+0085 but not U+FEFF.

Example::

    >>> rules = AllowList(keywords=frozenset({"type", "properties"}), formats=frozenset(),
    ...                   pattern_escapes="")
    >>> rules.refusal({"type": "object", "properties": {"a": {"not": {}}}})
    ('not', '#/properties/a')
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from constrained.schema.negation import disjoint
from constrained.schema.walk import (
    VALIDATION_KEYWORDS,
    is_int,
    is_number,
    is_unknown_format,
    iter_subschemas,
    json_type,
    nested_resources,
    reachable_subschemas,
    resolve_pointer,
    type_names,
)

# The type-specific keywords an allow-list may hold, by the instance type they apply to: in a
# schema without ``type`` they are refused (``_untyped_keyword``).
TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                         "multipleOf"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties", "minProperties",
                         "maxProperties"}),
}  # fmt: skip
TYPE_OF_KEYWORD: dict[str, str] = {kw: t for t, kws in TYPE_KEYWORDS.items() for kw in kws}

_EXCLUSIVE = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # a name JSON writes with an escape
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_ESCAPE = r"(?<!\\)(?:\\\\)*\\"  # an unescaped backslash
_LOOKAROUND = re.compile(r"(?<!\\)(?:\\\\)*\(\?<?[=!]")  # every allow-list backend drops them


@dataclass(frozen=True)
class AllowList:
    """What one backend enforces in a JSON schema; ``refusal`` finds what it would not.

    Attributes:
        keywords: the validation keywords it enforces (with the combination rules below).
        formats: the standard ``format``s it checks; other standard formats are refused.
        pattern_escapes: the letters ``x`` of the ``\\x`` regex escapes whose meaning differs
            from ECMA-262 in it (such a ``pattern`` is refused).
        schema_additional_properties: it enforces ``additionalProperties`` given as a schema,
            not only ``false``.
        infers_container_type: without ``type``, it reads a schema with ``properties`` /
            ``additionalProperties`` as an object and one with ``items`` / ``prefixItems`` as
            an array (stricter: other types are refused), so those keywords count as typed.
        skips_optional_group_rest: it matches an optional group whose body starts with a
            ``*`` / ``+`` repetition without the rest of the body (``^(?:a*c)?d$`` takes
            ``ad``; ``_optional_group_starting_with_repeat``): such a pattern is refused.
    """

    keywords: frozenset[str]
    formats: frozenset[str]
    pattern_escapes: str
    schema_additional_properties: bool = True
    infers_container_type: bool = False
    skips_optional_group_rest: bool = False

    def refusal(self, schema: Any) -> tuple[str, str] | None:
        """The first (keyword, JSON pointer) of ``schema`` not enforced, else ``None``."""
        for path, sub in nested_resources(schema):
            if any("$ref" in inner for _, inner in iter_subschemas(sub)):
                return "$id", path  # its "$ref"s resolve against the "$id", not the document
        for path, sub in reachable_subschemas(schema):
            for key in sub:
                unenforced = key in VALIDATION_KEYWORDS and key not in self.keywords
                if unenforced and not _vacuous(key, sub):
                    return key, path
            problem = self._combination_problem(sub, schema)
            if problem:
                return problem, path
        return None

    def pattern_problem(self, pattern: Any) -> bool:
        """A ``pattern`` whose meaning differs from ECMA-262 here, or that would be dropped."""
        if not isinstance(pattern, str):
            return False
        if _LOOKAROUND.search(pattern):
            return True
        if self.skips_optional_group_rest and _optional_group_starting_with_repeat(pattern):
            return True
        return self._escapes is not None and bool(self._escapes.search(pattern))

    @functools.cached_property
    def _escapes(self) -> re.Pattern[str] | None:
        return re.compile(_ESCAPE + f"[{self.pattern_escapes}]") if self.pattern_escapes else None

    def _combination_problem(self, sub: dict, root: Any) -> str | None:
        """A keyword it knows but would not enforce in this schema object."""
        for check in _COMBINATION_CHECKS:
            problem = check(self, sub, root)
            if problem:
                return problem
        return None


def _optional_group_starting_with_repeat(pattern: str) -> bool:
    """A group made optional by ``?`` (``(...)?`` or ``(...)??``) one of whose alternatives
    starts, possibly inside nested groups, with an element repeated by ``*``, ``+`` or
    ``{n,}`` (``(?:a*c)?``, ``(?:(?:x|y)+@)?``); also ``True`` for a pattern it cannot read."""
    try:
        groups = _groups(pattern)
    except ValueError:
        return True
    return any(
        pattern[end + 1 : end + 2] == "?" and _starts_with_repeat(pattern, start, end, groups)
        for start, end in groups.items()
    )


def _groups(pattern: str) -> dict[int, int]:
    """Each group's ``(`` index and its ``)`` index (escapes and classes skipped)."""
    found, open_at, i = {}, [], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 1
        elif char == "[":
            i = _class_end(pattern, i)
        elif char == "(":
            open_at.append(i)
        elif char == ")":
            if not open_at:
                raise ValueError(pattern)
            found[open_at.pop()] = i
        i += 1
    if open_at:
        raise ValueError(pattern)
    return found


def _class_end(pattern: str, start: int) -> int:
    """The index of the ``]`` closing the class opened at ``start``."""
    i = start + 1
    if pattern[i : i + 1] == "^":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    if i >= len(pattern):
        raise ValueError(pattern)
    return i


def _starts_with_repeat(pattern: str, start: int, end: int, groups: dict[int, int]) -> bool:
    """The group ``pattern[start:end + 1]`` has an alternative whose first element is
    repeated (``*``, ``+``, ``{n,}``), or is a group (unquantified) for which this holds."""
    body = start + 1
    if pattern[body : body + 2] == "?<":  # a named group (lookbehinds are refused anyway)
        body = pattern.index(">", body) + 1
    elif pattern[body : body + 1] == "?":  # (?: ...), lookaheads
        body += 2
    starts = [body] + [i + 1 for i in _top_level_bars(pattern, body, end, groups)]
    for first in starts:
        if first >= end or pattern[first] in "|)":
            continue
        after = _element_end(pattern, first, groups)
        quantifier = pattern[after : after + 1]
        if quantifier in ("*", "+") or re.match(r"\{\d*,\}", pattern[after:]):
            return True
        nested = pattern[first] == "(" and quantifier not in ("?", "{")
        if nested and _starts_with_repeat(pattern, first, groups[first], groups):
            return True
    return False


def _top_level_bars(pattern: str, body: int, end: int, groups: dict[int, int]) -> list[int]:
    """The indexes of the ``|`` of the group body ``pattern[body:end]`` not nested deeper."""
    bars, i = [], body
    while i < end:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i) + 1
            continue
        if char == "(":
            i = groups[i] + 1
            continue
        if char == "|":
            bars.append(i)
        i += 1
    return bars


def _element_end(pattern: str, first: int, groups: dict[int, int]) -> int:
    """The index just after the element (atom, class, escape or group) starting at ``first``."""
    char = pattern[first]
    if char == "(":
        return groups[first] + 1
    if char == "[":
        return _class_end(pattern, first) + 1
    if char == "\\":
        letter = pattern[first + 1 : first + 2]
        return first + 2 + {"u": 4, "x": 2, "c": 1}.get(letter, 0)
    return first + 1


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


def _exclusive_problem(rules: AllowList, sub: dict, root: Any) -> str | None:
    """These backends build a schema object from ONE of ``$ref``, ``const``, ``enum``,
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
    if (
        keyword == "oneOf"
        and isinstance(branches, list)
        and not all(disjoint(a, b) for a, b in itertools.combinations(branches, 2))
    ):
        return keyword  # checked as anyOf: right only when no value matches two branches
    return None


def _implied_type(sub: dict, keyword: str) -> bool:
    """Every value ``keyword`` allows already has one of ``sub["type"]``'s types."""
    types = type_names(sub.get("type"))
    if types is None:
        return False
    if keyword == "const":
        return json_type(sub["const"]) in types
    if keyword == "enum":
        values = sub["enum"]
        return isinstance(values, list) and all(json_type(v) in types for v in values)
    if keyword in ("anyOf", "oneOf", "allOf"):
        branches = sub[keyword]
        return isinstance(branches, list) and all(
            isinstance(b, dict) and (type_names(b.get("type")) or {"?"}) <= types for b in branches
        )
    return False


def _ref_problem(rules: AllowList, sub: dict, root: Any) -> str | None:
    if "$ref" not in sub:
        return None
    ref = sub["$ref"]
    if not isinstance(ref, str) or resolve_pointer(root, ref) is None:
        return "$ref"  # remote, "#anchor" or dangling: resolved to "anything"
    return None


def _string_problem(rules: AllowList, sub: dict, root: Any) -> str | None:
    fmt = sub.get("format")
    known = "format" in sub and not is_unknown_format(fmt)
    if known and not (isinstance(fmt, str) and fmt in rules.formats):
        return "format"
    if ("pattern" in sub or known) and ("minLength" in sub or "maxLength" in sub):
        return "minLength" if "minLength" in sub else "maxLength"  # only the regex is kept
    if "pattern" in sub and known:
        return "pattern"
    if rules.pattern_problem(sub.get("pattern")):
        return "pattern"
    return None


def _number_problem(rules: AllowList, sub: dict, root: Any) -> str | None:
    """``multipleOf`` is checked for integers only: up to 1024, and either unbounded or
    bounded on both sides at most 10,000 apart (xgrammar warns and drops it otherwise)."""
    if "multipleOf" not in sub:
        return None
    multiple = sub["multipleOf"]
    if not is_int(multiple) or not 0 < multiple <= 1024 or sub.get("type") != "integer":
        return "multipleOf"
    low = [sub[k] for k in ("minimum", "exclusiveMinimum") if k in sub]
    high = [sub[k] for k in ("maximum", "exclusiveMaximum") if k in sub]
    if not low and not high:
        return None
    if not (low and high) or not all(is_number(v) for v in low + high):
        return "multipleOf"
    return "multipleOf" if min(high) - max(low) > 10_000 else None


def _container_problem(rules: AllowList, sub: dict, root: Any) -> str | None:
    for key in _COUNTS:  # 2.0 is a valid bound, but outlines ignores it
        if key in sub and not is_int(sub[key]):
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
    if not rules.schema_additional_properties and isinstance(sub.get("additionalProperties"), dict):
        return "additionalProperties"
    if "patternProperties" in sub and not _closed_pattern_properties(rules, sub):
        return "patternProperties"
    return None


def _closed_pattern_properties(rules: AllowList, sub: dict) -> bool:
    """``patternProperties`` is enforced only as the sole way to add keys: one pattern,
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
        if rules.pattern_problem(pattern) or any(compiled.search(n) for n in names):
            return False
    return True


def _untyped_keyword(rules: AllowList, sub: dict, root: Any) -> str | None:
    """A type-specific keyword in a schema without ``type``: ignored there, except where the
    backend ``infers_container_type``.

    With a ``type`` it is enforced, or vacuous (``minLength`` of an integer).
    """
    if "type" in sub:
        return None
    implied: set[str] = set()
    if rules.infers_container_type:
        if "properties" in sub or "additionalProperties" in sub:
            implied.add("object")
        elif "items" in sub or "prefixItems" in sub:
            implied.add("array")
    for key in sub:
        wanted = TYPE_OF_KEYWORD.get(key)
        vacuous_format = key == "format" and is_unknown_format(sub[key])
        if wanted and wanted not in implied and not vacuous_format:
            return key
    return None


# In this order: the first problem found names the keyword refused.
_COMBINATION_CHECKS: tuple[Callable[[AllowList, dict, Any], str | None], ...] = (
    _exclusive_problem, _ref_problem, _string_problem, _number_problem, _container_problem,
    _untyped_keyword,
)  # fmt: skip
