"""``grammars/schema_rewrite.py``: rewritten schemas accept exactly what the originals accept.

Judged by ``jsonschema`` (the reference validator), over hand-written cases, every group of
the JSON-Schema-Test-Suite (draft 2020-12 and draft 7) and every MaskBench schema the
rewrite changes; then through the real masks: the groups of the keywords rewritten now
compile with ``auto`` and accept no invalid instance.

``format`` is judged as an assertion where the rewrite writes it as a pattern
(``FORMAT_PATTERNS``: ``uri-reference``, ``json-pointer``...), as jsonschema does with its
optional format packages installed (``rfc3986-validator``, ``jsonpointer``, absent here); those
patterns are checked on their own against the suite's ``optional/format`` groups.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from jsonschema import FormatChecker, validators

from constrained.grammars import GrammarError, GrammarSpec, compile_now
from constrained.schema.negation import apart, disjoint, negate, strings_other_than
from constrained.schema.rewrite import FORMAT_PATTERNS, rewrite_schema
from constrained.schema.walk import map_subschemas
from tests.soak import MASKBENCH
from tests.test_schema_suite import SUITE, WIDTH
from tests.walker import Walker

SUITES = {"draft2020-12": SUITE, "draft7": SUITE.parent / "draft7"}
DRAFTS = {"draft2020-12": validators.Draft202012Validator, "draft7": validators.Draft7Validator}
# Drafts where ``if``, ``const`` and ``dependentRequired`` are not yet keywords: a rewrite
# that enforces them anyway is stricter than jsonschema there, never looser.
OLD_DRAFTS = (validators.Draft4Validator, validators.Draft6Validator)


def validator(schema, default=validators.Draft202012Validator):
    cls = validators.validator_for(schema, default=default)
    return cls(schema, format_checker=format_checker(cls))


def format_checker(cls):
    """The draft's checker, plus the formats ``FORMAT_PATTERNS`` writes as patterns that
    it does not check itself (``date`` it does: the pattern is judged against it)."""
    checker = FormatChecker(formats=())
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    for name, pattern in FORMAT_PATTERNS.items():
        if name not in checker.checkers:
            checker.checks(name)(
                lambda x, p=pattern: not isinstance(x, str) or bool(re.search(p, x))
            )
    return checker


def verdicts(schema, instances, default=validators.Draft202012Validator, like=None):
    """jsonschema's verdicts; ``like``: the schema whose draft to judge by."""
    check = validator(like if like is not None else schema, default)
    if isinstance(check, validators.Draft4Validator):
        schema = without_booleans(schema)  # draft 4 has no boolean subschemas
    return [check.evolve(schema=schema).is_valid(x) for x in instances]


def without_booleans(schema, path="#"):
    """``true`` / ``false`` subschemas written as ``{}`` / ``{"not": {}}`` (the same)."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    if isinstance(schema, dict):
        schema = dict(schema)
        map_subschemas(schema, path, without_booleans)
    return schema


def need_suite() -> None:
    """Skip without the JSON-Schema-Test-Suite, but fail in CI: a skip is not a pass there."""
    if not SUITE.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"JSON-Schema-Test-Suite not found at {SUITE}")
        pytest.skip(f"JSON-Schema-Test-Suite not found at {SUITE}")


def assert_same_instances(schema, instances):
    rewritten = rewrite_schema(schema)
    assert verdicts(rewritten, instances, like=schema) == verdicts(schema, instances), rewritten


INSTANCES = [
    None, True, False, 0, 1, 2, 3, 1.5, -7, "", "a", "ab", "abc", "foo", "bar", [], [1],
    [1, 2, 3], {}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"a": "x", "c": 3}, {"a": 2, "b": 1},
    {"kind": "circle", "r": 1}, {"kind": "square", "side": 2}, {"kind": "circle", "side": 2},
    ["x"], ["x", 1], [[]], "12", "any", "./a", "http://a", "a b", "%zz", "/a~0b", "/a~2",
    {"a": ["x"], "kind": 1}, {"a": ["x"], "b": 1}, {"a": ["x"], "b": 1, "kind": 1},
    {"a": [1], "b": 1}, {"a": [], "kind": 1, "b": 0},
]  # fmt: skip

CASES = {
    "not type": {"not": {"type": "string"}},
    "not not": {"not": {"not": {"minimum": 2}}},
    "not enum": {"not": {"enum": [1, "foo", True, None]}},
    "not const within integers": {"type": "integer", "not": {"const": 2}},
    "not required": {"not": {"required": ["a", "b"]}},
    "not properties": {"not": {"properties": {"a": {"type": "string"}}}},
    "not anyOf": {"not": {"anyOf": [{"type": "string"}, {"maximum": 1}]}},
    "not allOf": {"not": {"allOf": [{"minLength": 2}, {"maxLength": 2}]}},
    "not bounds": {"not": {"minItems": 2, "maxProperties": 1}},
    "not false": {"not": False},
    "not items false": {"not": {"items": False}},
    "if then else": {
        "if": {"properties": {"kind": {"const": "circle"}}},
        "then": {"required": ["r"]},
        "else": {"required": ["side"]},
    },
    "if then": {"if": {"type": "string"}, "then": {"minLength": 2}},
    "then without if": {"then": {"type": "string"}},
    "dependentRequired": {"dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"dependentSchemas": {"a": {"properties": {"b": {"type": "string"}}}}},
    "dependencies": {
        "$schema": "http://json-schema.org/draft-07/schema#",  # a keyword until 2019-09
        "dependencies": {"a": ["b"], "c": {"required": ["a"]}},
    },
    "oneOf by type": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf overlapping": {"oneOf": [{"type": "number", "minimum": 1}, {"maximum": 2}]},
    "oneOf by discriminator": {
        "type": "object",
        "oneOf": [
            {"required": ["kind"], "properties": {"kind": {"const": "circle"}}},
            {"required": ["kind"], "properties": {"kind": {"const": "square"}}},
        ],
    },
    # without "type": non-objects satisfy both branches, so they are not disjoint
    "oneOf by discriminator, untyped": {
        "oneOf": [
            {"required": ["kind"], "properties": {"kind": {"const": "circle"}}},
            {"required": ["kind"], "properties": {"kind": {"const": "square"}}},
        ],
    },
    "oneOf through $ref": {
        "$defs": {"s": {"type": "string"}, "n": {"type": "number", "minimum": 2}},
        "oneOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/n"}, {"minimum": 3}],
    },
    "oneOf by discriminator in allOf branches": {
        "$defs": {
            "base": {"type": "object"},
            "circle": {
                "allOf": [
                    {"$ref": "#/$defs/base"},
                    {"required": ["kind"], "properties": {"kind": {"const": "circle"}}},
                ]
            },
            "square": {
                "allOf": [
                    {"$ref": "#/$defs/base"},
                    {"required": ["kind"], "properties": {"kind": {"const": "square"}}},
                ]
            },
        },
        "oneOf": [{"$ref": "#/$defs/circle"}, {"$ref": "#/$defs/square"}],
    },
    "oneOf sharing a property it cannot negate": {
        "oneOf": [
            {"required": ["kind"], "properties": {"a": {"items": {"type": "string"}}}},
            {"required": ["b"], "properties": {"a": {"items": {"type": "string"}}}},
        ],
    },
    "oneOf of arrays with disjoint items": {
        "oneOf": [{"items": {"type": "string"}}, {"items": {"type": "integer"}}],
    },
    "oneOf of patterns starting apart": {
        "type": "string",
        "oneOf": [{"pattern": "^https?://"}, {"pattern": "^\\./"}],
    },
    "oneOf of an enum and a pattern": {
        "oneOf": [{"enum": ["any", "12", 3]}, {"type": "string", "pattern": "^[0-9]+$"}],
    },
    "enum beside not": {"enum": [1, "a", [1], {"a": 1}, None], "not": {"type": "string"}},
    "enum in allOf beside not": {"allOf": [{"enum": [1, 2, 3, "x"]}, {"not": {"multipleOf": 2}}]},
    "enum through $ref beside oneOf": {
        "$defs": {"e": {"enum": ["12", "ab", 1]}},
        "$ref": "#/$defs/e",
        "oneOf": [{"pattern": "^[0-9]"}, {"type": "string", "minLength": 2}],
    },
    "propertyNames of a pattern": {"propertyNames": {"pattern": "^[ab]$"}},
    "propertyNames of a length beside properties": {
        "properties": {"a": {"type": "integer"}, "kind": {}},
        "propertyNames": {"maxLength": 1},
    },
    "propertyNames false": {"propertyNames": False},
    "propertyNames of an enum": {"propertyNames": {"enum": ["a", "kind", "r"]}},
    "format uri-reference": {"format": "uri-reference"},
    "format json-pointer": {"type": "string", "format": "json-pointer"},
    "unknown format": {"type": "string", "format": "color"},
    "propertyNames of any string": {"propertyNames": {"type": "string"}},
    "uniqueItems of at most one item": {"uniqueItems": True, "maxItems": 1},
    # Keywords the declared draft does not define assert nothing, negated too.
    "draft-4 not const": {"$schema": "http://json-schema.org/draft-04/schema#",
                          "not": {"const": 1}},
    "draft-6 not if": {"$schema": "http://json-schema.org/draft-06/schema#",
                       "not": {"if": {"const": 1}, "then": {"const": 2}}},
    "draft-7 not dependentRequired": {"$schema": "http://json-schema.org/draft-07/schema#",
                                      "not": {"dependentRequired": {"a": ["b"]}}},
    "draft-4 not bounds with exclusive flags": {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "not": {"minimum": 1, "exclusiveMinimum": True, "const": 2},
    },
    "draft-4 const kept out of oneOf": {"$schema": "http://json-schema.org/draft-04/schema#",
                                        "oneOf": [{"const": 1}, {"type": "integer"}]},
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_rewrite_accepts_exactly_the_same_instances(name):
    schema = CASES[name]
    rewritten = rewrite_schema(schema)
    assert rewritten != schema, "each case exercises a rule"
    assert_same_instances(schema, INSTANCES)


def test_a_keyword_its_draft_removed_is_never_negated():
    """``dependencies`` in a 2020-12 schema: enforced it is stricter than ignored, but under
    ``not`` it would be looser, so such a schema is left as written (the backend refuses
    ``not`` by name); without a negation it is rewritten, enforced."""
    draft = "https://json-schema.org/draft/2020-12/schema"
    negated = {"$schema": draft, "type": "object", "not": {"dependencies": {"a": ["b"]}}}
    assert rewrite_schema(negated) == negated
    plain = {"$schema": draft, "type": "object", "dependencies": {"a": ["b"]}}
    rewritten = rewrite_schema(plain)
    assert verdicts(rewritten, [{"a": 1}, {"a": 1, "b": 2}, {}]) == [False, True, True]


def test_provably_disjoint_one_of_becomes_any_of_without_negations():
    schema = CASES["oneOf by discriminator in allOf branches"]
    assert rewrite_schema(schema)["anyOf"] == schema["oneOf"]


def test_what_cannot_be_negated_exactly_is_left_for_the_backend_to_refuse():
    assert negate({"pattern": "^a"}) is None
    assert negate({"type": "integer"}) is None  # non-integer numbers alone: no type says it
    assert negate({"type": "integer"}, frozenset({"integer", "string"})) == {"type": "string"}
    schema = {"not": {"multipleOf": 3}}
    assert rewrite_schema(schema) == schema
    # a keyword a $ref points into stays where it is
    pinned = {"not": {"not": {"type": "string"}}, "$defs": {"x": {"$ref": "#/not/not"}}}
    assert rewrite_schema(pinned)["not"] == {"not": {"type": "string"}}


def test_finite_values_are_judged_only_where_jsonschema_is_exact():
    # every value an enum allows, judged against the node as written
    assert rewrite_schema(CASES["enum beside not"]) == {"enum": [1, [1], {"a": 1}, None]}
    assert rewrite_schema(CASES["enum in allOf beside not"]) == {"enum": [1, 3]}  # "x" too fails
    kept = [
        # floating point: jsonschema finds 0.3 no multiple of 0.1, decimal arithmetic does
        {"allOf": [{"enum": [0.3]}, {"not": {"multipleOf": 0.1}}]},
        # Python's "$" matches before a final line break, ECMA-262's does not
        {"enum": ["a\n"], "not": {"pattern": "^a$"}},
        {"enum": ["a1"], "not": {"pattern": "^a\\d$"}},  # \d: Unicode digits in Python
        {"enum": ["a"], "not": {"format": "email"}},  # format checkers differ
    ]
    for schema in kept:
        assert rewrite_schema(schema) == schema, schema
    # drafts disagree (draft 7 ignores keywords beside $ref) and none is declared: the
    # enum is not evaluated (the "not" is still negated, within every kind)
    beside_ref = {"$defs": {"e": {"enum": [1, 2]}}, "$ref": "#/$defs/e", "not": {"const": 1}}
    assert rewrite_schema(beside_ref)["$ref"] == "#/$defs/e"
    # a $ref from outside into what the enum would replace keeps the node
    pointed = {"enum": [1, 2], "not": {"const": 1}, "$defs": {"x": {"$ref": "#/not"}}}
    assert rewrite_schema(pointed)["not"] == {"const": 1}


def test_patterns_are_apart_by_their_first_characters_only_when_sure():
    string = {"type": "string"}
    assert disjoint({**string, "pattern": "^https?://.+$"}, {**string, "pattern": "^\\./.+$"})
    assert disjoint({**string, "pattern": "^u?int(8|16)?$"}, {**string, "pattern": "^bool"})
    assert disjoint({**string, "pattern": "^a"}, {**string, "pattern": "^[^a]"})
    assert "string" in apart({"pattern": "^[a-f]"}, {"pattern": "^\\d"})
    for a, b in [
        ("^a", "^[^b]"),  # "a" matches both
        ("^a|b", "^b"),  # the "|" leaves "b" unanchored
        ("^a?", "^b"),  # "^a?" matches every string
        ("^(?=a)", "^b"),  # lookarounds: unknown
        ("^\\s", "^a"),  # \s: not worked out
        ("a", "^b"),  # unanchored
        ("^.", "^a"),
    ]:
        assert "string" not in apart({"pattern": a}, {"pattern": b}), (a, b)
    assert "string" in apart({"pattern": "^."}, {"pattern": "^\n"})  # "." is no line break


def test_format_patterns_match_the_suite_format_groups():
    need_suite()
    checked = 0
    for folder in SUITES.values():
        for name, pattern in FORMAT_PATTERNS.items():
            groups = json.loads((folder / "optional" / "format" / f"{name}.json").read_text())
            for group in groups:
                for test in group["tests"]:
                    if isinstance(test["data"], str):
                        matched = re.fullmatch(pattern, test["data"]) is not None
                        assert matched == test["valid"], (name, test["description"])
                        checked += 1
    assert checked >= 100


def test_strings_other_than_is_the_exact_complement():
    excluded = ["ab", "b", "a.c", "", "x]-^\\"]
    pattern = strings_other_than(excluded)
    for text in ["a", "ab", "abc", "b", "ba", "a.c", "axc", "", " ", "x]-^\\", "x]-^"]:
        assert bool(re.search(pattern, text)) == (text not in excluded), text


def suite_groups():
    for draft, folder in SUITES.items():
        for path in sorted(folder.glob("*.json")):
            for index, group in enumerate(json.loads(path.read_text())):
                yield draft, f"{draft}/{path.stem}#{index}", group


def test_suite_groups_keep_their_verdicts():
    need_suite()
    changed = 0
    for draft, key, group in suite_groups():
        rewritten = rewrite_schema(group["schema"])
        if rewritten == group["schema"]:
            continue
        changed += 1
        if re.search(r'"\$(ref|dynamicRef)": "(?!#)', json.dumps(group["schema"])):
            continue  # a remote reference: jsonschema would fetch it over the network
        instances = [t["data"] for t in group["tests"]]
        before = verdicts(group["schema"], instances, DRAFTS[draft])
        assert verdicts(rewritten, instances, DRAFTS[draft], like=group["schema"]) == before, key
    assert changed >= 60  # measured: 64 groups use a keyword the rewrite expresses


def test_maskbench_schemas_accept_no_more_and_no_fewer():
    if not MASKBENCH.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"MaskBench not found at {MASKBENCH}")
        pytest.skip(f"MaskBench not found at {MASKBENCH}")
    changed = 0
    for path in sorted(MASKBENCH.glob("*.json")):
        case = json.loads(path.read_text())
        schema = case["schema"]
        rewritten = rewrite_schema(schema)
        if rewritten == schema:
            continue
        changed += 1
        instances = [t["data"] for t in case["tests"]]
        before, after = verdicts(schema, instances), verdicts(rewritten, instances, like=schema)
        looser = [x for x, b, a in zip(instances, before, after, strict=True) if a and not b]
        assert looser == [], path.name
        if not isinstance(validator(schema), OLD_DRAFTS):
            assert after == before, path.name
    assert changed >= 2000  # measured: 2,245


REWRITTEN_KEYWORDS = {
    "draft2020-12": ["if-then-else", "dependentRequired", "dependentSchemas", "propertyNames"],
    "draft7": ["dependencies", "if-then-else", "propertyNames"],
}


@pytest.fixture(scope="module")
def walker(tiny_model_dir: str) -> Walker:
    from constrained.grammars import load_vocab

    return Walker(load_vocab(tiny_model_dir, WIDTH))


def walked_suite_groups(draft: str, names: list[str], walker: Walker):
    """Every test of the suite files ``names`` of ``draft``, each group compiled with
    ``auto`` (one that does not compile fails the test) and the instance walked through its
    masks: (file name, group index, test, accepted)."""
    need_suite()
    for name in names:
        for index, group in enumerate(json.loads((SUITES[draft] / f"{name}.json").read_text())):
            spec = GrammarSpec("json_schema", json.dumps(group["schema"]), "auto")
            try:
                compiled = compile_now(spec, walker.vocab)
            except GrammarError as exc:
                pytest.fail(f"{draft}/{name}#{index} does not compile: {exc}")
            for test in group["tests"]:
                yield name, index, test, walker.accepts(compiled, test["data"])


@pytest.mark.parametrize("draft", REWRITTEN_KEYWORDS)
def test_rewritten_keyword_groups_compile_and_mask_no_invalid_instance(draft, walker):
    for name, index, test, accepted in walked_suite_groups(
        draft, REWRITTEN_KEYWORDS[draft], walker
    ):
        assert not (accepted and not test["valid"]), (name, index, test["description"])


def test_a_date_is_exact_on_xgrammar(walker):
    """xgrammar's own ``date`` lets 2020-02-30 and 2020-04-31 through: it refuses the format
    as written, and the schema rewritten with the exact ``full-date`` pattern masks exactly
    the suite's valid strings (leap years, month lengths, ASCII digits only). (xgrammar
    refuses a ``pattern`` without ``"type": "string"``, so the suite's untyped schema is
    typed here, and its instances of other types left out.)"""
    need_suite()
    walked = 0
    for draft, folder in SUITES.items():
        groups = json.loads((folder / "optional" / "format" / "date.json").read_text())
        for group in groups:
            schema = {**group["schema"], "type": "string"}
            compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema), "xgrammar"),
                                   walker.vocab)  # fmt: skip
            for test in (t for t in group["tests"] if isinstance(t["data"], str)):
                accepted = walker.accepts(compiled, test["data"])
                assert accepted == test["valid"], (draft, test["description"])
                walked += 1
    assert walked >= 100


def test_hand_cases_compile_and_mask_no_invalid_instance(walker):
    """Each hand case through ``auto`` and the masks: an instance jsonschema rejects is never
    accepted (one that compiles as written never reaches the rewrite: skipped)."""
    walked = 0
    for name, schema in CASES.items():
        try:
            compiled = compile_now(
                GrammarSpec("json_schema", json.dumps(schema), "auto"), walker.vocab
            )
        except GrammarError:
            continue
        for instance, valid in zip(INSTANCES, verdicts(schema, INSTANCES), strict=True):
            assert valid or not walker.accepts(compiled, instance), (name, instance)
            walked += 1
    assert walked >= 20 * len(INSTANCES)
