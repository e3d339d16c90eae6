"""``uniqueItems`` and ``contains``, checked while the output is written (``array_checks.py``,
``json_scan.py``, ``checked_matcher.py``): exact verdicts through the masks on hand cases and
on the suite's groups, random walks through the masks that only ever end valid, rollback,
refusals by name and the compiled-grammar store."""

from __future__ import annotations

import json
import pathlib
import random
import zlib

import pytest
from jsonschema import validators

from constrained.grammars import GrammarError, GrammarSpec, compile_now
from constrained.grammars.checked_matcher import CheckedGrammar
from constrained.grammars.closing import allowed_ids, find_witness
from constrained.grammars.compiler import GrammarCompiler
from constrained.grammars.store import GrammarStore
from constrained.schema.array_checks import canonical, canonical_text, plan_checks
from constrained.schema.json_scan import Recorder, Scan, feed
from tests.test_schema_rewrite import walked_suite_groups
from tests.test_schema_suite import WIDTH
from tests.walker import Walker

MASKBENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"

STRINGS = {"type": "array", "items": {"type": "string", "maxLength": 6}, "uniqueItems": True}
COLOURS = {
    "type": "array",
    "items": {"enum": ["red", "green", "blue"]},
    "uniqueItems": True,
    "minItems": 3,
}
DIGITS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 1, "maximum": 4},
    "uniqueItems": True,
    "minItems": 4,
}
ANYTHING = {"type": "array", "uniqueItems": True, "maxItems": 6}
NESTED = {
    "type": "array",
    "items": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "uniqueItems": True,
    "maxItems": 4,
}
THREES = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 9},
    "contains": {"const": 3},
    "minContains": 2,
    "maxContains": 3,
}
LETTERS = {
    "type": "array",
    "items": {"enum": ["a", "b", "c"]},
    "contains": {"const": "c"},
    "minContains": 2,
    "maxContains": 3,
}
ROLES = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"r": {"type": "string", "maxLength": 4}},
        "required": ["r"],
        "additionalProperties": False,
    },
    "uniqueItems": True,
    "contains": {"properties": {"r": {"const": "lead"}}},
    "minContains": 0,
    "maxContains": 1,
    "maxItems": 4,
}
LETTER = {"type": "array", "items": {"type": "string", "maxLength": 1}, "uniqueItems": True}
NUMBERS = {"type": "array", "items": {"type": "number"}, "uniqueItems": True}
TAGGED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"$ref": "#/$defs/tags"},
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"role": {"enum": ["lead", "dev"]}},
                "required": ["role"],
                "additionalProperties": False,
            },
            "contains": {"properties": {"role": {"const": "lead"}}},
            "maxContains": 1,
            "maxItems": 3,
        },
    },
    "required": ["name", "tags", "people"],
    "additionalProperties": False,
    "$defs": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
}
CASES = {
    "strings": (STRINGS, [["a", "b"], ["a", "a"], [], ["ab", "a", "abc", "ab"], ['x"y', 'x"y']]),
    "colours": (COLOURS, [["red", "blue", "green"], ["red", "red", "blue"], ["red", "blue"]]),
    "digits": (DIGITS, [[1, 2, 3, 4], [4, 3, 2, 1], [1, 2, 1, 3]]),
    "anything": (
        ANYTHING,
        [
            [1, 1.0],
            [1, True],
            [0, False],
            [None, None],
            [{"a": 1, "b": 2}, {"b": 2, "a": 1}],
            [[1], [1]],
            [{"a": [1]}, {"a": [2]}],
            ["1", 1],
            [[], {}],
            [-0, 0],
        ],
    ),
    "nested": (NESTED, [[[1, 2], [2, 1]], [[1, 2], [1, 2]], [[1, 1]], [[], [3]]]),
    "threes": (THREES, [[3, 3], [3], [3, 1, 3, 3], [3, 3, 3, 3], [1, 2], []]),
    "roles": (
        ROLES,
        [
            [{"r": "x"}, {"r": "lead"}],
            [{"r": "x"}, {"r": "x"}],
            [],
            [{"r": "lead"}, {"r": "x"}, {"r": "lead"}],
        ],
    ),
    "letter": (LETTER, [["a", "b"], ["a", "a"]]),
    "format": (  # maxContains counts what any reading matches: "a" too, without format checks
        {
            "type": "array",
            "items": {"type": "string"},
            "contains": {"format": "ipv4"},
            "maxContains": 1,
        },
        [["1.2.3.4", "a"], ["1.2.3.4"], ["1.2.3.4", "5.6.7.8"]],
    ),
    "draft 7 items": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "array",
            "prefixItems": [{"type": "array"}],
            "items": {"type": "array", "uniqueItems": True},
        },
        [[[1, 1]], [[1, 2]]],
    ),
    "anyOf items": (
        {
            "type": "array",
            "uniqueItems": True,
            "anyOf": [{"items": {"enum": ["a", "b"]}}, {"maxItems": 5}],
        },
        [["x", "y"], ["a", "a"]],
    ),
    "ref chain": (
        {
            "$ref": "#/components/a",
            "components": {
                "a": {"$ref": "#/components/b"},
                "b": {"type": "array", "uniqueItems": True},
            },
        },
        [[1, 1], [1, 2]],
    ),
    "letters": (LETTERS, [["c", "a", "c"], ["c"], ["c", "c", "c", "c"], ["a", "c", "c", "c"]]),
    "tagged": (
        TAGGED,
        [
            {"name": "a", "tags": ["x", "y"], "people": [{"role": "lead"}, {"role": "dev"}]},
            {"name": "a", "tags": ["x", "x"], "people": []},
            {"name": "a", "tags": [], "people": [{"role": "lead"}, {"role": "lead"}]},
        ],
    ),
}
# The same values written differently (where the backend allows the spelling): equal all the
# same. llguidance writes no ``\u`` escapes; ``canonical_text`` reads them (a test below).
SPELLINGS = [
    (ANYTHING, "[1,1e0]", False),
    (ANYTHING, "[10,1e1]", False),
    (ANYTHING, "[0.5,5e-1]", False),
    (ANYTHING, "[0.5,5e-2]", True),
    (ANYTHING, '[{"a":1},{"a":1.0}]', False),
    (NUMBERS, "[0.1,0.10000000000000001]", False),  # one float, as jsonschema reads them
    (NUMBERS, "[1e308,10e307]", False),  # (1e400 is never written: test_finite_numbers)
    (NUMBERS, "[0,1e-400]", False),
    (ANYTHING, '[{"a":1,"b":[2]},{"b":[2.0],"a":1}]', False),
    (ANYTHING, r'["\\n","\n"]', True),
]


@pytest.fixture(scope="module")
def walker(tiny_model_dir: str) -> Walker:
    from constrained.grammars import load_vocab

    return Walker(load_vocab(tiny_model_dir, WIDTH))


def compiled(schema: dict, walker: Walker, whitespace: str = "compact") -> CheckedGrammar:
    spec = GrammarSpec("json_schema", json.dumps(schema), "auto", whitespace=whitespace)
    grammar = compile_now(spec, walker.vocab)
    assert isinstance(grammar, CheckedGrammar)
    return grammar


@pytest.mark.parametrize("name", CASES)
def test_masks_accept_exactly_the_valid_instances(name, walker):
    schema, instances = CASES[name]
    grammar = compiled(schema, walker)
    check = validators.validator_for(schema, default=validators.Draft202012Validator)(schema)
    for instance in instances:
        assert walker.accepts(grammar, instance) == check.is_valid(instance), instance


@pytest.mark.parametrize(("schema", "text", "valid"), SPELLINGS)
def test_equal_values_are_equal_however_written(schema, text, valid, walker):
    grammar = compiled(schema, walker)
    tokens = walker.tokenizer.encode(text)
    assert walker.walk(grammar.inner, tokens)[0], text  # the backend allows this spelling
    assert walker.walk(grammar, tokens)[0] == valid, text


def test_flexible_whitespace_between_items(walker):
    grammar = compiled(STRINGS, walker, whitespace="flexible")
    for text, valid in (('["a", "b"]', True), ('["a", "a"]', False), ('["a",\n "a"]', False)):
        assert walker.walk(grammar, walker.tokenizer.encode(text))[0] == valid, text


SUITE_KEYWORDS = {
    "draft2020-12": ["uniqueItems", "contains", "minContains", "maxContains"],
    "draft7": ["uniqueItems", "contains"],
}


@pytest.mark.parametrize("draft", SUITE_KEYWORDS)
def test_suite_groups_compile_and_masks_agree_with_every_verdict(draft, walker):
    walked = 0
    for name, index, test, accepted in walked_suite_groups(draft, SUITE_KEYWORDS[draft], walker):
        assert accepted == test["valid"], (name, index, test["description"])
        walked += 1
    assert walked >= 60


def random_outputs(grammar, walker: Walker, count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` random walks through the masks (each step a random allowed token, a short
    one more often, then the shortest way to finish): (text, how it ended)."""
    rng = random.Random(seed)
    vocab, pieces = walker.vocab, walker.vocab.token_bytes()
    short = [i for i, p in enumerate(pieces) if 0 < len(p) <= 2]
    outputs = []
    for _ in range(count):
        matcher, tokens = grammar.matcher(), []
        for _ in range(rng.randrange(4, 40)):
            matcher.fill(walker.bitmask, 0)
            allowed = allowed_ids(walker.bitmask[0], vocab.width)
            if vocab.eos_token_id is not None and allowed[vocab.eos_token_id]:
                break
            ids = [i for i in short if allowed[i]] if rng.random() < 0.7 else []
            ids = ids or allowed.nonzero()[0].tolist()
            token = rng.choice(ids)
            assert matcher.consume([token]), matcher.error
            tokens.append(token)
        rest = find_witness(matcher, vocab, 200) if matcher.error is None else None
        if rest is None:
            outputs.append((b"".join(pieces[t] for t in tokens).decode(errors="replace"), "stuck"))
            continue
        assert matcher.consume(rest) and matcher.accepts_end()
        text = b"".join(pieces[t] for t in tokens + rest).decode()
        outputs.append((text, "complete"))
    return outputs


RANDOM_WALKED = [
    "strings", "colours", "digits", "anything", "nested", "threes", "letters", "roles", "letter",
]  # fmt: skip


@pytest.mark.parametrize("name", RANDOM_WALKED)
def test_random_walks_through_the_masks_end_valid(name, walker):
    schema = CASES[name][0]
    grammar = compiled(schema, walker)
    check = validators.validator_for(schema, default=validators.Draft202012Validator)(schema)
    outputs = random_outputs(grammar, walker, 25, seed=zlib.crc32(name.encode()))
    complete = [text for text, how in outputs if how == "complete"]
    invalid = [text for text in complete if not check.is_valid(json.loads(text))]
    assert invalid == []
    # The look-aheads keep enum and bounded-integer items from a dead end.
    assert len(complete) == len(outputs), [o for o in outputs if o[1] != "complete"]


def test_rollback_restores_the_checks(walker):
    grammar = compiled(STRINGS, walker)
    tokens = walker.tokens(["ab", "cd", "ef"])
    matcher = grammar.matcher()
    assert matcher.consume(tokens[:3])
    before = (matcher.scan.copy(), bytes(matcher.text))
    assert matcher.try_consume(tokens[3:]) == len(tokens) - 3
    matcher.rollback(len(tokens) - 3)
    assert (matcher.scan, bytes(matcher.text)) == before
    repeat = walker.tokens(["ab", "cd", "ab"])
    fresh = grammar.matcher()
    assert fresh.try_consume(repeat) < len(repeat)  # stops before the repeat completes
    assert fresh.error is None


def test_a_dead_end_reached_around_the_masks_writes_the_backends_row(walker):
    """At most 4 integers 0..5, one a 5: the masks never let ``[2,1,2,1`` be written (the
    fourth item must be the 5). Reached anyway (``try_consume`` reads no mask), the checks
    leave nothing: the row is the backend's own (the output still parses, never a bare
    end-of-sequence), ``stuck`` is set, and the rollback leaves the matcher as it was."""
    schema = {"type": "array", "maxItems": 4, "contains": {"const": 5},
              "items": {"type": "integer", "minimum": 0, "maximum": 5}}  # fmt: skip
    grammar = compiled(schema, walker)
    width = walker.vocab.width
    tokens = walker.tokenizer.encode("[2,1,2,1")
    matcher = grammar.matcher()
    assert matcher.consume(tokens[:1])
    assert matcher.try_consume(tokens[1:]) == len(tokens) - 1
    matcher.fill(walker.bitmask, 0)
    assert matcher.stuck
    checked = allowed_ids(walker.bitmask[0], width).copy()
    backend = grammar.inner.matcher()
    assert backend.consume(tokens)
    backend.fill(walker.bitmask, 0)
    assert (checked == allowed_ids(walker.bitmask[0], width)).all()
    matcher.rollback(len(tokens) - 1)
    matcher.stuck = False
    assert matcher.consume(walker.tokenizer.encode("2,1,2,"))
    matcher.fill(walker.bitmask, 0)
    allowed = allowed_ids(walker.bitmask[0], width).nonzero()[0].tolist()
    assert allowed == walker.tokenizer.encode("5") and not matcher.stuck


def test_a_number_that_can_only_stay_a_repeat_is_refused_early(walker):
    """After ``[0,0`` the second 0 may still become ``0.5``, but ``0e...`` is 0 whatever
    exponent follows: ``e`` is refused there, ``.`` allowed."""
    grammar = compiled(NUMBERS, walker)
    matcher = grammar.matcher()
    assert matcher.consume(walker.tokenizer.encode("[0,0"))
    matcher.fill(walker.bitmask, 0)
    allowed = allowed_ids(walker.bitmask[0], walker.vocab.width)
    exponent, point = walker.tokenizer.encode("e"), walker.tokenizer.encode(".")
    assert not allowed[exponent[0]] and allowed[point[0]]


def test_escaped_surrogates_do_not_break_the_check(walker):
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    spec = GrammarSpec("json_schema", json.dumps(schema), "xgrammar")
    grammar = compile_now(spec, walker.vocab)  # xgrammar writes \u escapes
    tokens = walker.tokenizer.encode('["\\ud800","a","\\ud800"]')
    assert walker.walk(grammar.inner, tokens)[0]
    assert not walker.walk(grammar, tokens)[0]


def test_a_token_that_opens_an_array_and_writes_in_it_is_followed():
    from constrained.schema.json_scan import token_reach

    reach = token_reach([b"[1,", b"[", b"a", b'"]'])
    assert reach.outside_bracket.tolist() == [True, False, False, False]
    assert reach.inside_bracket.tolist() == [False, False, False, True]  # "[1," is string text


def test_a_token_that_breaks_a_check_ends_the_request(walker):
    grammar = compiled(STRINGS, walker)
    tokens = walker.tokens(["a", "a"])
    matcher = grammar.matcher()
    assert not matcher.consume(tokens)
    assert matcher.error is not None and not matcher.accepts_end()
    matcher.fill(walker.bitmask, 0)
    assert allowed_ids(walker.bitmask[0], walker.vocab.width).nonzero()[0].tolist() == [
        walker.vocab.eos_token_id
    ]


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "not": {"uniqueItems": True}}, "uniqueItems"),
        ({"if": {"contains": {"const": 1}}, "then": {"maxItems": 2}}, "contains"),
        ({"uniqueItems": True, "unevaluatedItems": False}, "uniqueItems"),
        ({"items": {"$ref": "other.json"}, "uniqueItems": True}, "uniqueItems"),
        (
            {
                "$defs": {
                    "a": {
                        "$id": "a.json",
                        "items": {"$ref": "#/$defs/b"},
                        "uniqueItems": True,
                        "$defs": {"b": {}},
                    }
                }
            },
            "uniqueItems",
        ),
    ],
)
def test_checks_that_cannot_be_followed_are_refused_by_name(schema, keyword, walker):
    with pytest.raises(GrammarError) as error:
        compile_now(GrammarSpec("json_schema", json.dumps(schema)), walker.vocab)
    assert error.value.keyword == keyword


def test_the_plan_follows_instance_locations():
    text = json.dumps(
        {
            "properties": {"a": {"uniqueItems": True}},
            "patternProperties": {"^x": {"contains": {"type": "string"}}},
            "additionalProperties": {"items": {"uniqueItems": True}},
            "anyOf": [{"properties": {"b": {"uniqueItems": True}}}],
        }
    )
    stripped, plan = plan_checks(text, "auto")
    assert "uniqueItems" not in stripped and "contains" not in stripped
    rules = lambda *path: plan.rules(follow(plan, path))  # noqa: E731
    assert rules("a").unique and rules("b").unique
    assert rules("xyz").contains and not rules("xyz").unique
    assert rules("other") is None and rules("other", 0).unique
    assert rules("a", 0) is None


def follow(plan, path):
    nodes = plan.root
    for at in path:
        nodes = plan.child(nodes, at)
    return nodes


def test_draft_vocabulary_decides_what_is_checked():
    old = {"$schema": "http://json-schema.org/draft-04/schema#", "contains": {"const": 1}}
    stripped, plan = plan_checks(json.dumps(old), "auto")
    assert plan.rules(plan.root) is None and "contains" not in stripped
    seven = {"$schema": "http://json-schema.org/draft-07/schema#", "contains": {}, "minContains": 2}
    _, plan = plan_checks(json.dumps(seven), "auto")
    assert plan.rules(plan.root).contains[0].at_least == 1  # minContains is not draft 7's
    assert plan_checks('{"type": "array", "items": {"minimum": 1}}', "auto") is None


def test_canonical_equality():
    assert canonical_text(b"1") == canonical_text(b"1.0") == canonical_text(b"1e0")
    assert canonical_text(b"true") != canonical_text(b"1")
    assert canonical_text(b'{"a":[1,2],"b":null}') == canonical({"b": None, "a": [1.0, 2]})
    assert canonical_text(b"[1,2]") != canonical_text(b"[2,1]")
    assert canonical_text(b'"\\u00e9"') == canonical_text('"é"'.encode())


def test_scan_reports_items_at_every_depth():
    events = Recorder()
    text = b'{"k": [1, {"a": [true, "x\\"]"]}, null, 2.5e3], "z": []}'
    assert feed(Scan(), text, 0, bytearray(), events)
    assert events.items == [b"1", b"true", b'"x\\"]"', b'{"a": [true, "x\\"]"]}', b"null", b"2.5e3"]
    split = Recorder()  # the same text fed in pieces
    scan, before = Scan(), bytearray()
    for i in range(0, len(text), 3):
        assert feed(scan, text[i : i + 3], len(before), before, split)
        before += text[i : i + 3]
    assert split.items == events.items


def test_the_store_keeps_the_backend_grammar_and_the_checks_come_back(tmp_path, walker):
    spec = GrammarSpec("json_schema", json.dumps(STRINGS))
    store = GrammarStore(tmp_path, 64 * 1024 * 1024)
    first = GrammarCompiler(walker.vocab, store=store)
    first._load_or_compile(spec)  # compiles and saves (whatever its compile time)
    second = GrammarCompiler(walker.vocab, store=store)
    loaded = second._load_or_compile(spec)
    assert isinstance(loaded, CheckedGrammar)
    assert not walker.accepts(loaded, ["a", "a"]) and walker.accepts(loaded, ["a", "b"])


def test_a_plan_is_the_same_however_its_schema_sits_in_memory():
    """A plan's sets of subschemas are sets of ``id()``s; everything read from them (an
    array's ``contains`` checks, the values tried to steer an item into a match) comes in
    the schema's own order, not the addresses': the same schema gives the same rows in every
    process and on every rank (it once gave 5 or 9 unfinished walks run to run)."""
    from constrained.schema.array_checks import sample_values

    text = (MASKBENCH / "Handwritten---itemscontains2.json").read_text()
    schema_text = json.dumps(json.loads(text)["schema"])
    seen = set()
    held = []
    for size in range(12):
        held.append([{} for _ in range(size * 37)])  # other objects: other addresses
        _, plan = plan_checks(schema_text, "auto")
        item = plan.child(plan.root, 0)
        rules = plan.rules(item)
        order = json.dumps([c.schema for c in rules.contains])
        nodes = plan.ordered(plan.child(item, 0))
        samples = sample_values(nodes, plan.schema)
        seen.add((order, json.dumps(nodes), json.dumps(samples)))
    assert len(seen) == 1, seen
