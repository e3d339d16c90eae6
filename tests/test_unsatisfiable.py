"""Schemas with no valid instance (``constrained.schema.satisfiable``): refused naming the
keywords that contradict, and never a schema that has one.

- Generated contradictions (each kind the issue names, with random values, placed at the
  root, in a required property, an ``allOf`` branch, a ``$ref`` target, the items
  ``minItems`` asks for, or every branch of an ``anyOf``): each is refused, naming a keyword
  that takes part, and a brute-force search over a small universe of values finds no instance.
- Random schemas over small domains: whenever the brute-force search finds an instance, the
  schema is not called unsatisfiable; whatever is refused names keywords the schema has.
- The corpora: no group of the JSON-Schema-Test-Suite with a valid test, and no MaskBench
  schema with a valid instance, is called unsatisfiable.
"""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from constrained import Options
from constrained.schema.satisfiable import no_instance
from tests.soak import MASKBENCH

SUITE = MASKBENCH.parent / "json-schema-test-suite" / "tests"
EXAMPLES = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip

# ---- a small universe of JSON values, searched exhaustively ---------------------------------

SCALARS = [None, True, False, -2, -1, 0, 1, 2, 3, 0.5, 2.5, "", "a", "b", "ab", "abc"]
TINY = [None, 0, 1, "a", True]
KEYS = ("a", "b", "c", "abc")


def _universe() -> list:
    arrays = [[]] + [[v] for v in SCALARS] + [list(p) for p in itertools.product(SCALARS, repeat=2)]
    arrays += [list(p) for p in itertools.product([0, 1, 2, "a"], repeat=3)]
    objects = [{}]
    for size in (1, 2, 3):
        for names in itertools.combinations(KEYS, size):
            for values in itertools.product(TINY, repeat=size):
                objects.append(dict(zip(names, values, strict=True)))
    return SCALARS + arrays + objects


UNIVERSE = _universe()


def an_instance(schema) -> object:
    """A value of the universe the schema accepts, or ``None``... as a 1-tuple, or ``()``."""
    check = Draft202012Validator(schema)
    for value in UNIVERSE:
        if check.is_valid(value):
            return (value,)
    return ()


def keys_in(schema) -> set[str]:
    """Every key of the schema, and ``false`` where a subschema accepts nothing."""
    found: set[str] = {"false"} if schema is False else set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found |= set(node)
            stack.extend(node.values())
            if any(v is False for v in node.values()) or node.get("not") in ({}, True):
                found.add("false")
        elif isinstance(node, list):
            stack.extend(node)
    return found


# ---- generated contradictions ------------------------------------------------------------

small = st.integers(min_value=-2, max_value=3)
scalar = st.sampled_from(SCALARS)


@st.composite
def contradictions(draw) -> tuple[dict, set[str]]:
    """A schema no value satisfies, and the keywords that take part."""
    kind = draw(st.integers(min_value=0, max_value=15))
    n = draw(st.integers(min_value=0, max_value=2))
    if kind == 0:  # contains against items' bounds
        top = draw(small)
        return (
            {
                "type": "array",
                "items": {"type": "integer", "maximum": top},
                "contains": {"const": top + 1 + n},
            },
            {"contains", "items", "maximum", "const"},
        )
    if kind == 1:  # contains against items' enum
        values = draw(st.lists(scalar, min_size=1, max_size=3, unique_by=json.dumps))
        missing = draw(scalar.filter(lambda v: json.dumps(v) not in map(json.dumps, values)))
        return (
            {"type": "array", "items": {"enum": values}, "contains": {"const": missing}},
            {"contains", "items", "enum", "const"},
        )
    if kind == 2:  # contains against prefixItems, nothing after them
        return (
            {
                "type": "array",
                "prefixItems": [{"const": 1}, {"type": "string"}],
                "items": False,
                "contains": {"type": "boolean"},
            },
            {"contains", "prefixItems", "items", "const", "type"},
        )
    if kind == 3:  # minContains above maxItems
        return (
            {"type": "array", "contains": {}, "minContains": n + 1, "maxItems": n},
            {"minContains", "maxItems"},
        )
    if kind == 4:  # minContains above maxContains
        return (
            {
                "type": "array",
                "contains": {"type": "integer"},
                "minContains": n + 2,
                "maxContains": n + 1,
            },
            {"minContains", "maxContains"},
        )
    if kind == 5:  # uniqueItems with fewer distinct values than minItems
        values = draw(st.lists(scalar, min_size=1, max_size=3, unique_by=json.dumps))
        return (
            {
                "type": "array",
                "uniqueItems": True,
                "minItems": len(values) + 1 + n,
                "items": {"enum": values},
            },
            {"uniqueItems", "minItems", "items"},
        )
    if kind == 6:  # required against maxProperties
        return (
            {"type": "object", "required": list(KEYS[: n + 2]), "maxProperties": n + 1},
            {"required", "maxProperties"},
        )
    if kind == 7:  # required against propertyNames
        names = draw(st.sampled_from([{"maxLength": 2}, {"enum": ["a", "b"]},
                                      {"pattern": "^[ab]+$"}]))  # fmt: skip
        return (
            {"type": "object", "required": ["abc"], "propertyNames": names},
            {"required", "propertyNames"},
        )
    if kind == 8:  # required against a closed object
        return (
            {
                "type": "object",
                "properties": {"a": {}},
                "additionalProperties": False,
                "required": ["a", "b"],
            },
            {"required", "additionalProperties"},
        )
    if kind == 9:  # minimum above maximum
        low = draw(small)
        word = draw(st.sampled_from(["maximum", "exclusiveMaximum"]))
        high = low - n - (1 if word == "maximum" else 0)
        return (
            {"type": draw(st.sampled_from(["integer", "number"])), "minimum": low, word: high},
            {"minimum", word},
        )
    if kind == 10:  # no integer (or multiple) within the bounds
        return ({"type": "integer", "minimum": 0.2 + n, "maximum": 0.8 + n}, {"minimum", "maximum"})
    if kind == 11:  # minLength above maxLength
        return (
            {"type": "string", "minLength": n + 2, "maxLength": n + 1},
            {"minLength", "maxLength"},
        )
    if kind == 12:  # an enum emptied by intersections
        left = draw(st.lists(scalar, min_size=1, max_size=3, unique_by=json.dumps))
        right = [v for v in SCALARS if json.dumps(v) not in map(json.dumps, left)][:2]
        return {"enum": left, "allOf": [{"enum": right}]}, {"enum"}
    if kind == 13:  # not of everything
        inner = draw(st.sampled_from([{}, True, {"description": "anything"}]))
        return {"not": inner}, {"not"}
    if kind == 14:  # minItems above maxItems
        return ({"type": "array", "minItems": n + 2, "maxItems": n + 1}, {"minItems", "maxItems"})
    return (
        {"type": "object", "minProperties": n + 2, "maxProperties": n + 1},
        {"minProperties", "maxProperties"},
    )


@st.composite
def placed(draw) -> tuple[dict, set[str]]:
    """A contradiction where an instance must meet it."""
    schema, keywords = draw(contradictions())
    where = draw(st.integers(min_value=0, max_value=5))
    if where == 1:
        return (
            {"type": "object", "properties": {"p": schema}, "required": ["p"]},
            keywords | {"required"},
        )
    if where == 2:
        return {"allOf": [{"description": "a branch"}, schema]}, keywords
    if where == 3:
        return {"$defs": {"d": schema}, "$ref": "#/$defs/d"}, keywords
    if where == 4:
        return {"type": "array", "minItems": 1, "items": schema}, keywords | {"minItems", "items"}
    if where == 5:
        other, more = draw(contradictions())
        return {"anyOf": [schema, other]}, keywords | more | {"anyOf"}
    return schema, keywords


@EXAMPLES
@given(placed())
def test_a_contradiction_is_refused_naming_its_keywords(case):
    schema, keywords = case
    assert an_instance(schema) == (), schema  # the generator's own check
    found = no_instance(schema)
    assert found is not None, schema
    assert set(found.keywords) & keywords, (found, schema)
    assert set(found.keywords) <= keys_in(schema) | {"$ref"}, (found, schema)


def test_the_issues_schema_is_refused_naming_contains_and_items():
    schema = {"type": "array", "maxItems": 1, "items": {"type": "integer", "maximum": 5},
              "contains": {"const": 7}}  # fmt: skip
    with pytest.raises(ValueError) as refused:
        Options(json_schema=schema)
    message = str(refused.value)
    assert "json_schema" in message and "has no valid instance" in message
    for keyword in ("contains", "items", "maximum"):
        assert f"'{keyword}'" in message, message
    assert "max_tokens" not in message


# ---- random schemas: never called unsatisfiable when an instance exists --------------------


def subschemas(depth: int):
    leaf = st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(
                    [
                        "integer",
                        "number",
                        "string",
                        "boolean",
                        "null",
                        "array",
                        "object",
                        ["integer", "string"],
                    ]
                ),
                "minimum": small,
                "maximum": small,
                "exclusiveMinimum": small,
                "exclusiveMaximum": small,
                "multipleOf": st.sampled_from([1, 2, 3, 0.5]),
                "minLength": st.integers(0, 3),
                "maxLength": st.integers(0, 3),
                "enum": st.lists(scalar, min_size=1, max_size=3, unique_by=json.dumps),
                "const": scalar,
            },
        ),
        st.booleans(),
    )
    if depth == 0:
        return leaf
    inner = subschemas(depth - 1)
    return st.one_of(
        leaf,
        st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["array", "object"]),
                "items": inner,
                "prefixItems": st.lists(inner, max_size=2),
                "contains": inner,
                "minContains": st.integers(0, 3),
                "maxContains": st.integers(0, 3),
                "minItems": st.integers(0, 3),
                "maxItems": st.integers(0, 3),
                "uniqueItems": st.just(True),
                "required": st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
                "properties": st.dictionaries(st.sampled_from(KEYS), inner, max_size=2),
                "additionalProperties": inner,
                "propertyNames": inner,
                "minProperties": st.integers(0, 3),
                "maxProperties": st.integers(0, 3),
            },
        ),
        st.fixed_dictionaries(
            {},
            optional={
                "allOf": st.lists(inner, min_size=1, max_size=3),
                "anyOf": st.lists(inner, min_size=1, max_size=3),
                "oneOf": st.lists(inner, min_size=1, max_size=3),
                "not": inner,
                "type": st.sampled_from(["integer", "string", "array", "object"]),
            },
        ),
    )


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(subschemas(2))
def test_no_schema_with_an_instance_is_called_unsatisfiable(schema):
    found = no_instance(schema)
    if found is None:
        return
    assert an_instance(schema) == (), (found, schema)
    assert set(found.keywords) <= keys_in(schema) | {"$ref"}, (found, schema)


# ---- the corpora ---------------------------------------------------------------------------

DRAFT7 = "http://json-schema.org/draft-07/schema#"


def test_no_suite_group_with_a_valid_test_is_called_unsatisfiable():
    called = []
    for path in sorted(SUITE.rglob("*.json")):
        draft7 = "draft7" in path.parts
        for group in json.loads(path.read_text()):
            schema = group["schema"]
            if draft7 and isinstance(schema, dict) and "$schema" not in schema:
                schema = {"$schema": DRAFT7, **schema}
            found = no_instance(schema)
            if found is not None:
                called.append(group["description"])
                assert not any(t["valid"] for t in group["tests"]), (path.name, group, found)
    # Those whose every test is invalid because nothing is valid: false, not {}, ...
    assert len(called) >= 15, called


def test_no_maskbench_schema_is_called_unsatisfiable():
    paths = sorted(pathlib.Path(MASKBENCH).glob("*.json"))
    assert len(paths) > 11_000
    called = [p.name for p in paths if no_instance(json.loads(p.read_text())["schema"])]
    assert called == []
