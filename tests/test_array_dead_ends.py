"""No dead ends in the array checks, by construction (#27): random walks through the masks
(each step a token drawn uniformly among those allowed, end-of-sequence included) over
generated schemas, the suite's array groups, the two measured failures and a sample of
MaskBench never reach a row the checks leave empty (``CheckedMatcher.stuck``), never end on
an output that does not validate, and finish valid; checks no array meets are refused when
compiled, naming the keyword; witness walks meet ``contains``."""

from __future__ import annotations

import json
import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.array_walks import DATA, checked_schemas, random_walk, validator
from constrained.grammars import GrammarError, GrammarSpec, compile_now
from constrained.grammars.checked_matcher import CheckedGrammar
from constrained.grammars.closing import allowed_ids, find_witness
from tests.test_schema_suite import WIDTH
from tests.walker import Walker

CHECKED = {"uniqueItems", "contains", "minContains", "maxContains"}
# The two measured failures: random output reached ``[2,1,2,1`` / ``[2,1,0,0,2,2`` and the
# checks left only end-of-sequence (a ``stop`` on invalid output).
MEASURED = {
    "contains at maxItems": {
        "type": "array",
        "maxItems": 4,
        "items": {"type": "integer", "minimum": 0, "maximum": 5},
        "contains": {"const": 5},
    },
    "minContains at maxItems": {
        "type": "array",
        "maxItems": 6,
        "items": {"type": "integer", "minimum": 0, "maximum": 5},
        "contains": {"const": 5},
        "minContains": 2,
    },
}
HAND = {
    "strings, contains at maxItems": {
        "type": "array",
        "maxItems": 3,
        "items": {"type": "string", "maxLength": 5},
        "contains": {"const": "lead"},
    },
    "objects, minContains at maxItems": {
        "type": "array",
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {"r": {"type": "string", "maxLength": 4}},
            "required": ["r"],
            "additionalProperties": False,
        },
        "contains": {"properties": {"r": {"const": "lead"}}},
        "minContains": 2,
    },
    "enum, maxContains and minItems": {
        "type": "array",
        "items": {"enum": ["lead", "dev", "ops"]},
        "contains": {"const": "lead"},
        "maxContains": 1,
        "minItems": 3,
    },
    "unique enum, contains, minItems": {
        "type": "array",
        "items": {"enum": ["a", "b", "c", "d"]},
        "uniqueItems": True,
        "contains": {"enum": ["c", "d"]},
        "minContains": 2,
        "minItems": 3,
        "maxItems": 3,
    },
    "enum objects, maxContains": {
        "type": "array",
        "maxItems": 4,
        "items": {
            "type": "object",
            "properties": {"role": {"enum": ["lead", "dev"]}},
            "required": ["role"],
            "additionalProperties": False,
        },
        "contains": {"properties": {"role": {"const": "lead"}}},
        "maxContains": 1,
        "minItems": 2,
    },
}


@pytest.fixture(scope="module")
def walker(tiny_model_dir: str) -> Walker:
    from constrained.grammars import load_vocab

    return Walker(load_vocab(tiny_model_dir, WIDTH))


def compiled(schema: dict, walker: Walker) -> CheckedGrammar:
    grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
    assert isinstance(grammar, CheckedGrammar)
    return grammar


def walk_many(schema: dict, grammar, walker: Walker, count: int, seed: str, steps: int = 40,
              finished: bool = True) -> None:  # fmt: skip
    """``count`` random walks: none stuck, none invalid; with ``finished``, each completes
    (drawn end-of-sequence or the witness)."""
    rng = random.Random(zlib.crc32(seed.encode()))
    check = validator(schema)
    for _ in range(count):
        walk = random_walk(grammar, walker.vocab, walker.bitmask, rng, steps, check)
        assert not walk.stuck, (seed, walk.text)
        assert walk.valid is not False, (seed, walk.text, walk.ended)
        if finished:
            assert walk.ended != "unfinished", (seed, walk.text)


@pytest.mark.parametrize("name", [*MEASURED, *HAND])
def test_random_walks_never_stop_on_invalid_output(name, walker):
    schema = {**MEASURED, **HAND}[name]
    walk_many(schema, compiled(schema, walker), walker, 25, name)


def test_the_last_room_left_takes_the_match_at_its_first_token(walker):
    """``[2,1,2,`` with one item left and the 5 still missing: only ``5`` is allowed (no
    token of another item, no end-of-sequence)."""
    grammar = compiled(MEASURED["contains at maxItems"], walker)
    matcher = grammar.matcher()
    assert matcher.consume(walker.tokenizer.encode("[2,1,2,"))
    matcher.fill(walker.bitmask, 0)
    allowed = allowed_ids(walker.bitmask[0], walker.vocab.width).nonzero()[0].tolist()
    assert allowed == walker.tokenizer.encode("5")
    strings = compiled(HAND["strings, contains at maxItems"], walker).matcher()
    assert strings.consume(walker.tokenizer.encode('["a","b",'))
    strings.fill(walker.bitmask, 0)
    allowed = allowed_ids(walker.bitmask[0], walker.vocab.width).nonzero()[0].tolist()
    assert allowed and all(walker.vocab.token_bytes()[t] in (b'"', b'"lead', b'"le', b'"l',
                           b'"lead"', b'"lea') for t in allowed)  # fmt: skip


def test_witness_walks_meet_contains(walker):
    """Admission's witness (closers first, shortest values) takes a matching item where
    one is needed, instead of ``0`` until ``maxItems``: found, and valid."""
    for name, schema in {**MEASURED, **HAND}.items():
        grammar = compiled(schema, walker)
        witness = find_witness(grammar.matcher(), walker.vocab, 200)
        assert witness is not None, name
        text = b"".join(walker.vocab.token_bytes()[t] for t in witness)
        assert validator(schema).is_valid(json.loads(text)), (name, text)
    unbounded = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7},
                 "minContains": 3}  # fmt: skip
    witness = find_witness(compiled(unbounded, walker).matcher(), walker.vocab, 200)
    assert b"".join(walker.vocab.token_bytes()[t] for t in witness) == b"[7,7,7]"


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 3},
         "uniqueItems"),
        ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3},
         "uniqueItems"),
        ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
          "contains": {"const": 9}}, "contains"),
        ({"type": "array", "items": {"enum": ["a", "b"]}, "contains": {"type": "string"},
          "maxContains": 0, "minItems": 1}, "maxContains"),
        ({"type": "array", "contains": {"type": "integer"}, "minContains": 3, "maxItems": 2},
         "minContains"),
        ({"type": "array", "contains": {"const": 1}, "minContains": 3, "maxContains": 2},
         "maxContains"),
        ({"type": "array", "contains": False}, "contains"),
        ({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x"]},
          "uniqueItems": True, "minItems": 2}}}, "uniqueItems"),
    ],
)  # fmt: skip
def test_checks_no_array_meets_are_refused_naming_the_keyword(schema, keyword, walker):
    with pytest.raises(GrammarError) as error:
        compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
    assert error.value.keyword == keyword
    assert "unsatisfiable" in str(error.value) and "dead end" in str(error.value)


def test_an_array_no_check_can_be_met_is_not_opened(walker):
    """``contains: false`` without a type: any value but an array is valid, and the
    checks refuse the ``[``."""
    schema = {"contains": False}
    grammar = compiled(schema, walker)
    matcher = grammar.matcher()
    matcher.fill(walker.bitmask, 0)
    allowed = allowed_ids(walker.bitmask[0], walker.vocab.width)
    pieces = walker.vocab.token_bytes()
    opening = [t for t in allowed.nonzero()[0] if pieces[t].lstrip(b" \t\n\r")[:1] == b"["]
    assert allowed.any() and opening == []
    walk_many(schema, grammar, walker, 5, "contains false", finished=False)


# -- generated schemas -----------------------------------------------------------------------

DOMAINS = st.one_of(
    st.tuples(st.just("integers"), st.integers(0, 3), st.integers(0, 6)),
    st.tuples(st.just("enum"), st.lists(st.sampled_from(["a", "b", "c", "d", "e"]),
                                        min_size=1, max_size=5, unique=True), st.none()),
    st.tuples(st.just("booleans"), st.none(), st.none()),
)  # fmt: skip


@st.composite
def array_schemas(draw: st.DrawFn) -> dict:
    kind, first, second = draw(DOMAINS)
    if kind == "integers":
        items = {"type": "integer", "minimum": first, "maximum": first + second}
        values = list(range(first, first + second + 1))
    elif kind == "enum":
        items, values = {"enum": first}, first
    else:
        items, values = {"type": "boolean"}, [False, True]
    schema: dict = {"type": "array", "items": items}
    if draw(st.booleans()):
        schema["uniqueItems"] = True
    if draw(st.booleans()):
        matching = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3, unique=True))
        schema["contains"] = {"const": matching[0]} if len(matching) == 1 else {"enum": matching}
        if draw(st.booleans()):
            schema["minContains"] = draw(st.integers(0, 3))
        if draw(st.booleans()):
            schema["maxContains"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["minItems"] = draw(st.integers(0, 4))
    if draw(st.booleans()):
        schema["maxItems"] = draw(st.integers(schema.get("minItems", 0), 6))
    return schema


def satisfiable(schema: dict) -> bool:
    """Brute force over the item domain: some array of at most 7 items is valid."""
    import itertools

    items = schema["items"]
    if "enum" in items:
        values = items["enum"]
    elif items.get("type") == "boolean":
        values = [False, True]
    else:
        values = list(range(items["minimum"], items["maximum"] + 1))
    check = validator(schema)
    return any(
        check.is_valid(list(combo))
        for size in range(8)
        for combo in itertools.combinations_with_replacement(values, size)
    )


SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=SLOW_OK)
@given(schema=array_schemas())
def test_generated_schemas_compile_refused_or_walk_valid(schema, walker):
    """Each generated schema is refused naming a checked keyword exactly when no array
    meets it (up to 7 items; ordering never matters to these keywords), else random walks
    through its masks complete valid and never stuck."""
    try:
        grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
    except GrammarError as error:
        assert error.keyword in CHECKED, str(error)
        assert not satisfiable(schema), (schema, str(error))
        return
    assert satisfiable(schema), schema
    walk_many(schema, grammar, walker, 4, json.dumps(schema, sort_keys=True), steps=30)


# -- the suite's array groups and MaskBench ---------------------------------------------------


def test_suite_array_groups_walk_valid(walker):
    from tests.test_array_checks import SUITE_KEYWORDS
    from tests.test_schema_rewrite import SUITES, need_suite

    need_suite()
    walked = 0
    for draft, names in SUITE_KEYWORDS.items():
        for name in names:
            groups = json.loads((SUITES[draft] / f"{name}.json").read_text())
            for index, group in enumerate(groups):
                schema = group["schema"]
                grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
                if not isinstance(grammar, CheckedGrammar):
                    continue
                seed = f"{draft}/{name}#{index}"
                walk_many(schema, grammar, walker, 3, seed, steps=25, finished=False)
                walked += 1
    assert walked >= 35


MASKBENCH_SAMPLE = 8


def test_a_maskbench_sample_walks_valid(walker):
    """A fixed sample of the MaskBench schemas with array checks that compile (the full set:
    ``python -m benchmarks.array_walks``)."""
    if not DATA.is_dir():
        pytest.skip(f"no MaskBench data in {DATA}")
    cases = checked_schemas(DATA)
    ordered = sorted(cases, key=lambda case: zlib.crc32(case[0].encode()))
    walked = 0
    for name, schema in ordered:
        if walked >= MASKBENCH_SAMPLE:
            break
        try:
            grammar = compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
        except GrammarError:
            continue
        if not isinstance(grammar, CheckedGrammar):
            continue
        walk_many(schema, grammar, walker, 2, name, steps=40, finished=False)
        walked += 1
    assert walked == MASKBENCH_SAMPLE
