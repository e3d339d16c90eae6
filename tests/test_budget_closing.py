"""Budget-aware closing (``close_at_max_tokens``): witnesses, and the V1 processor finishing
every constrained request, complete, by its ``max_tokens``.

The witness tests run each backend's real matcher; the processor test drives
``GrammarMaskProcessor`` with simulated V1 batch updates (joins, leaves, moves, preemption
with the output so far) and random logits, as ``test_grammar_bookkeeping.py`` does. The
real engine's side is in ``test_structured_engine.py`` (V1) and the ``budget_closing``
scenario of ``test_v2_real_sampler.py`` (vLLM's real V2 sampler).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from constrained.grammars import GrammarSpec, compile_now
from constrained.grammars.closing import allowed_ids, completes, find_witness, keeps_completion
from constrained.grammars.matcher import words_for
from constrained.processors.grammar_mask import GrammarMaskProcessor
from tests.simulate import Request, V1Batch
from tests.test_grammar_bookkeeping import (
    CAPACITY,
    TOOL_CALL,
    WIDTH,
    Reference,
    config,
    sample,
    spec_for,
    vocab,
)

__all__ = ["config", "vocab"]  # module fixtures shared with the bookkeeping test

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3},
        "age": {"type": "integer", "minimum": 18},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
# (constraint, backend): every backend, JSON and regex.
CASES = [
    ({"json_schema": json.dumps(PERSON)}, "llguidance"),
    ({"json_schema": json.dumps({**PERSON, "properties": {**PERSON["properties"],
      "address": {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}}})}, "xgrammar"),
    ({"json_schema": json.dumps({"type": "array", "items": {"type": "integer"}, "minItems": 3})},
     "outlines"),
    ({"regex": "[a-z]+@[a-z]+\\.(com|org)"}, "llguidance"),
    ({"regex": "(ab)*c[0-9]{3}"}, "xgrammar"),
    ({"grammar": 'root ::= "[" ("a" | "bb") ("," ("a" | "bb"))* "]"'}, "llguidance"),
    ({"structural_tag": TOOL_CALL}, "xgrammar"),
]  # fmt: skip


def spec_of(extra: dict, backend: str) -> GrammarSpec:
    return spec_for({**extra, "grammar_backend": backend})


def mask_of(matcher) -> torch.Tensor:
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    matcher.fill(bitmask, 0)
    return bitmask


@pytest.mark.parametrize(("extra", "backend"), CASES)
def test_witness_completes_and_leaves_the_matcher_where_it_was(vocab, extra, backend):
    grammar = compile_now(spec_of(extra, backend), vocab)
    matcher = grammar.matcher()
    rng = random.Random(0)
    for _ in range(6):  # from the start, then from random points of a random output
        before = mask_of(matcher)
        witness = find_witness(matcher, vocab, 200)
        assert witness is not None, extra
        assert torch.equal(mask_of(matcher), before), "the walk moved the matcher"
        assert completes(matcher, witness)
        text = vocab.hf_tokenizer.decode(witness)
        if "json_schema" in extra and not matcher.accepts_end():
            assert text.endswith(("}", "]")), text
        ids = allowed_ids(mask_of(matcher)[0], WIDTH).nonzero()[0]
        ids = ids[ids != vocab.eos_token_id]
        if not ids.size:
            break
        assert matcher.consume([int(rng.choice(ids[:2000]))])


def test_witness_for_a_pattern_only_content_order_reaches(vocab):
    """An e-mail ``format`` accepts ``}`` inside the string: the content order reaches ``@``."""
    schema = {"type": "object", "properties": {"e": {"type": "string", "format": "email"}},
              "required": ["e"], "additionalProperties": False}  # fmt: skip
    matcher = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab).matcher()
    witness = find_witness(matcher, vocab, 100)
    assert witness is not None
    document = json.loads(vocab.hf_tokenizer.decode(witness))
    assert "@" in document["e"]


@pytest.mark.parametrize("fmt", ["date", "date-time", "time"])
def test_witness_for_a_date_is_a_date_python_reads(vocab, fmt):
    """RFC 3339 allows year 0000, Python's ``date`` (so pydantic and jsonschema) does not: a
    closed date must not pick it."""
    import jsonschema

    schema = {"type": "object", "properties": {"d": {"type": "string", "format": fmt}},
              "required": ["d"], "additionalProperties": False}  # fmt: skip
    matcher = compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab).matcher()
    witness = find_witness(matcher, vocab, 100)
    assert witness is not None
    document = json.loads(vocab.hf_tokenizer.decode(witness))
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    jsonschema.Draft202012Validator(schema, format_checker=checker).validate(document)


def test_keeps_completion_checks_room(vocab):
    matcher = compile_now(GrammarSpec("regex", "[0-9]{2,5}"), vocab).matcher()
    one = vocab.hf_tokenizer.encode("1")[0]
    assert matcher.consume([one, one])  # "11": complete, room for up to 3 more digits
    assert keeps_completion(matcher, one, [[]], room=2) == []  # the digit, then EOS
    assert keeps_completion(matcher, one, [[]], room=1) is None  # no room for EOS after it
    for _ in range(3):
        assert matcher.consume([one])
    assert keeps_completion(matcher, one, [[]], room=5) is None  # a sixth digit is refused


def test_a_stack_that_cannot_close_says_so_once(vocab, monkeypatch):
    """A budget no completion fits (admission would refuse it; here forced): the closing
    layer is not silent, the engine's log says so, once per request, and leaves the row as
    the grammar wrote it (the request is cut at ``max_tokens``: ``length``, never a ``stop``)."""
    from constrained.grammars import closing_matcher
    from constrained.grammars.closing_matcher import ClosingMatcher

    said: list[str] = []
    monkeypatch.setattr(closing_matcher.logger, "warning", lambda msg, *a: said.append(msg % a))
    grammar = compile_now(spec_of(*CASES[0]), vocab)
    need = len(find_witness(grammar.matcher(), vocab, 200))
    tight = ClosingMatcher(grammar.matcher(), vocab, limit=need // 2)
    for _ in range(3):
        assert torch.equal(mask_of(tight), mask_of(grammar.matcher()))
    assert len(said) == 1, said
    assert f"max_tokens={need // 2}" in said[0] and "may be cut" in said[0]
    roomy = ClosingMatcher(grammar.matcher(), vocab, limit=need + 1)
    mask_of(roomy)
    assert not roomy.warned


def budget_request(rng: random.Random, req_id: int, needs: dict) -> Request:
    extra, backend = rng.choice(CASES)
    extra = {**extra, "grammar_backend": backend}
    key = json.dumps(extra, sort_keys=True)
    budget = needs[key] + 1 + rng.randint(0, 14)  # from just enough to a little more
    params = SamplingParams(temperature=1.0, max_tokens=budget, extra_args=extra)
    return Request(req_id, params, [rng.randrange(1000) for _ in range(3)])


@pytest.mark.parametrize("seed", [0, 1])
def test_v1_every_request_finishes_complete_by_max_tokens(vocab, config, seed):
    """Random logits, budgets from the shortest witness + 1 up: every constrained request
    ends with end-of-sequence by ``max_tokens`` and its output is complete; every row allows
    only what the grammar allows; preempted requests resume mid-closing."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
    reference = Reference(vocab)
    needs = {}
    for extra, backend in CASES:
        extra = {**extra, "grammar_backend": backend}
        spec = spec_of(extra, backend)
        needs[json.dumps(extra, sort_keys=True)] = len(
            find_witness(compile_now(spec, vocab).matcher(), vocab, 200)
        )
    batch = V1Batch(CAPACITY, rng)
    next_id, finished, closing_rows, narrowed = 0, 0, 0, 0
    eos = vocab.eos_token_id
    for step in range(160):
        new = [budget_request(rng, next_id + i, needs) for i in range(rng.randint(0, 2))]
        next_id += len(new)
        proc.update_state(batch.step(new))
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), WIDTH)
        out = proc.apply(logits.clone())
        for i, req in enumerate(batch.rows):
            extra = req.params.extra_args
            grammar_allows = reference.allowed(extra, req.output)
            got = out[i] > float("-inf")
            assert not (got & ~grammar_allows).any(), f"step {step}: a token the grammar refuses"
            left = req.params.max_tokens - len(req.output)
            narrowed += int(got.sum()) < int(grammar_allows.sum())
            closing_rows += left <= 12
            token = sample(out[i], rng)
            req.output.append(token)
            if token == eos or len(req.output) >= req.params.max_tokens:
                req.done = True
                assert token == eos, f"{extra} cut at max_tokens: {req.output}"
                spec = spec_of(extra, extra["grammar_backend"])
                matcher = reference.compiled.get(spec) or compile_now(spec, vocab)
                assert completes(matcher.matcher(), req.output[:-1]), (extra, req.output)
                finished += 1
    assert finished >= 30 and closing_rows >= 100 and narrowed >= 30, (
        finished,
        closing_rows,
        narrowed,
    )


# Finite languages and their longest output in characters (so in tokens: no token is empty).
FINITE = [
    ({"regex": "[0-9]{2,5}"}, "llguidance", 5),
    ({"regex": "[0-9]{2,5}"}, "xgrammar", 5),
    ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}},
      "required": ["a"], "additionalProperties": False}), "whitespace": "compact"},
     "llguidance", len('{"a":false}')),
    ({"choice": ["yes", "no", "maybe later"]}, "llguidance", len("maybe later")),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "backend", "longest"), FINITE)
def test_closing_changes_nothing_while_every_path_fits(vocab, extra, backend, longest):
    """At every budget of at least the longest output plus one (end-of-sequence), random
    walks see every row exactly as the grammar writes it with closing off (zero distortion,
    so the sampled distributions are the same); a tighter budget narrows, and still ends."""
    from constrained.grammars.closing_matcher import ClosingMatcher

    grammar = compile_now(spec_of(extra, backend), vocab)
    eos = vocab.eos_token_id
    narrowed_any = False
    shortest = len(find_witness(grammar.matcher(), vocab, 64))
    for limit in range(shortest + 1, longest + 8):  # admission refuses a shorter budget
        for seed in range(4):
            rng = random.Random(limit * 100 + seed)
            closing, plain = ClosingMatcher(grammar.matcher(), vocab, limit), grammar.matcher()
            output: list[int] = []
            while True:
                row, free = mask_of(closing), mask_of(plain)
                if limit > longest:
                    assert torch.equal(row, free), (extra, limit, output)
                narrowed_any |= not torch.equal(row, free)
                ids = allowed_ids(row[0], WIDTH).nonzero()[0]
                token = int(rng.choice(ids))
                if token == eos:
                    break
                assert len(output) + 1 < limit, f"{extra} cut at {limit}: {output}"
                output.append(token)
                assert closing.consume([token]) and plain.consume([token])
            assert plain.accepts_end()
    assert narrowed_any  # the budgets below the longest output did narrow


def test_short_budget_keeps_every_digit(vocab):
    """The measured case: ``[0-9]{2,5}`` at ``max_tokens=16`` (the completions API's default)
    allowed 8 of the 10 digits under the old window; every path fits, so all 10 stay."""
    from constrained.grammars.closing_matcher import ClosingMatcher

    grammar = compile_now(GrammarSpec("regex", "[0-9]{2,5}"), vocab)
    digits = [vocab.hf_tokenizer.encode(str(d))[0] for d in range(10)]
    row = allowed_ids(mask_of(ClosingMatcher(grammar.matcher(), vocab, 16))[0], WIDTH)
    assert row[digits].all()


def take_then_walk(vocab, schema: dict, text: str, budgets: range) -> tuple[int, int]:
    """At each budget, a closing stack takes ``text``'s tokens while its rows allow them,
    then walks at random: every output that took them all must end, valid, in time.
    Returns how many budgets took the text and how many kept it out."""
    from tests.closing_walk import allowed, closing_stack, judge, walk

    compiled = compile_now(spec_for({"json_schema": json.dumps(schema)}), vocab)
    path = vocab.hf_tokenizer.encode(text, add_special_tokens=False)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    rng, taken, kept_out = random.Random(0), 0, 0
    for budget in budgets:
        stack = closing_stack(compiled, vocab, budget)
        for token in path:
            if token not in allowed(stack, bitmask, 0, WIDTH).tolist():
                kept_out += 1
                break
            assert stack.consume([token])
        else:
            taken += 1
            done = walk(stack, vocab, bitmask, rng, budget - len(path))
            assert done.ended == "eos", (budget, done.ended)
            assert judge(path + done.tokens, vocab, schema) == "valid"
    return taken, kept_out


def test_a_property_written_a_token_per_byte_is_kept_out_when_it_cannot_fit(vocab):
    """Closing's ``reach`` counts the root witness in bytes: spelt in tokens it is short
    (``{"aside":true,"ref":"null"}``, 9), but the optional ``stamp`` opens a date-time
    written a digit per token (about 20). Counted in tokens, ``stamp`` was let in while far
    at budgets 20 to 36 and the output was cut; now every budget either keeps it out or
    completes after it (found by the engine test at ``max_tokens`` 32)."""
    properties = {
        "stamp": {"type": "string", "format": "date-time"},
        "aside": {"type": "boolean"},
        "ref": {"type": "string", "pattern": "^[a-z]+$"},
    }
    schema = {"type": "object", "properties": properties, "required": ["aside", "ref"]}
    taken, _ = take_then_walk(vocab, schema, '{"stamp":"', range(10, 40, 2))
    assert taken  # the largest budgets let it in


def test_requests_of_one_grammar_share_their_near_rows_checks(vocab, monkeypatch):
    """The first request to check a near row checks it for the others at the same state
    (``ClosingTables.sorts``): the second request's rows equal a lone request's, bit for bit, and
    it sorts fewer rows itself (its rows inside the strings come from the store)."""
    from constrained.grammars.closing_matcher import ClosingMatcher
    from constrained.grammars.closing_row_sort import RowSorter
    from constrained.grammars.closing_sorts import forget_shared_sorts
    from constrained.grammars.closing_tables import tables_of
    from tests.closing_walk import allowed

    forget_shared_sorts()
    compiled = compile_now(spec_for({"json_schema": json.dumps(PERSON)}), vocab)
    sorts = {"count": 0}
    sort_tokens = RowSorter.sort_tokens

    def counted(self, *args):
        sorts["count"] += 1
        return sort_tokens(self, *args)

    monkeypatch.setattr(RowSorter, "sort_tokens", counted)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    person = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"],
              "address": {"city": "London", "zip": "12345"}}  # fmt: skip
    text = json.dumps(person, separators=(",", ":"))
    path = vocab.hf_tokenizer.encode(text, add_special_tokens=False)
    budget = len(path) + 4  # near from the start: most rows are checked

    def rows(shared) -> tuple[list, int]:
        before = sorts["count"]
        stack = ClosingMatcher(compiled.matcher(), vocab, budget, [], None, shared)
        seen = []
        for token in path:
            seen.append(allowed(stack, bitmask, 0, WIDTH).tolist())
            assert stack.consume([token])
        return seen, sorts["count"] - before

    alone, sorted_alone = rows(None)
    first, _ = rows(tables_of(compiled).sorts)
    second, sorted_second = rows(tables_of(compiled).sorts)
    assert first == alone and second == alone
    assert sorted_alone > 0 and sorted_second < sorted_alone
    # Array checks make a row depend on the items seen: equal rows are not equal states.
    unique = {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True}
    checked = compile_now(spec_for({"json_schema": json.dumps(unique)}), vocab)
    assert checked.history and tables_of(checked).sorts is None


def test_the_last_row_keeps_the_tokens_that_end_the_output_without_walking(vocab, monkeypatch):
    """With room for one token and end-of-sequence (``left == 2``), a token must end the
    output itself: each is checked once, with no walk (the row was the costliest of a
    request: 147,000 string tokens, a walk each class); every kept token ends it, and
    those that do are kept (``"`` and text then ``"``)."""
    from constrained.grammars.closing_check import Checker
    from constrained.grammars.closing_matcher import ClosingMatcher
    from tests.closing_walk import allowed

    compiled = compile_now(spec_for({"json_schema": json.dumps({"type": "string"})}), vocab)
    encode = vocab.hf_tokenizer.encode
    path, quote = encode('"abc', add_special_tokens=False), encode('"', add_special_tokens=False)
    stack = ClosingMatcher(compiled.matcher(), vocab, len(path) + 2, [quote])  # the witness
    assert stack.consume(path) and stack.left == 2
    walks = []
    walk = Checker.walk
    monkeypatch.setattr(Checker, "walk", lambda self, *a: walks.append(a) or walk(self, *a))
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    kept = allowed(stack, bitmask, 0, WIDTH).tolist()
    assert not walks
    text_quote = encode('x"', add_special_tokens=False)
    assert len(quote) == 1 and quote[0] in kept
    assert len(text_quote) > 1 or text_quote[0] in kept
    assert all(completes(stack, [token]) for token in kept)
    assert len(kept) < 20_000  # the string's text tokens that do not close it are cleared


def test_qwen_xml_tool_calls_close_in_raw_text():
    """Qwen3.5's XML tool calls (vLLM's tag for ``tool_choice="required"``): parameter values
    are raw text, where ``</`` is the witness's first token inside a wide row whose class
    stands on plain letters; every walk at a budget from the shortest call up still ends
    with a complete call by ``max_tokens`` (the served failure: arguments ``{}``, cut)."""
    from constrained.grammars import load_vocab
    from constrained.grammars.closing_matcher import ClosingMatcher
    from constrained.tiny_model import build_tiny_model
    from tests.test_structural_tag import WEATHER, compiled, vllm_tag

    width = 248_320
    vocab36 = load_vocab(str(build_tiny_model("qwen3.6")), width)
    grammar = compiled(vocab36, vllm_tag("qwen_3_5", "required", WEATHER))
    shortest = len(find_witness(grammar.matcher(), vocab36, 256))
    eos = vocab36.eos_token_id
    bitmask = torch.zeros(1, words_for(width), dtype=torch.int32)
    for seed in range(10):
        rng = random.Random(seed)
        limit = shortest + 1 + 5 * seed
        closing = ClosingMatcher(grammar.matcher(), vocab36, limit)
        output: list[int] = []
        while True:
            closing.fill(bitmask, 0)
            ids = allowed_ids(bitmask[0], width).nonzero()[0]
            assert ids.size, f"an empty row at {len(output)} of {limit}"
            token = int(rng.choice(ids))
            if token == eos:
                break
            assert len(output) + 1 < limit, f"cut at {limit}: {output}"
            output.append(token)
            assert closing.consume([token])
        assert completes(grammar.matcher(), output)


def test_an_optional_value_longer_than_the_root_witness_is_kept_out_when_it_cannot_fit(vocab):
    """The known cut of ``reach``: the root ``{"a":true}`` is 10 bytes, but the optional
    ``stamp`` opens a date-time of about 22 tokens. A grammar's rise (``root_rise``: the most
    a token of a narrow row along the root witness raised the need, walked once per grammar)
    widens ``reach``, so ``stamp`` is kept out at every budget it cannot finish in."""
    properties = {
        "stamp": {"type": "string", "format": "date-time"},
        "a": {"type": "boolean"},
    }
    schema = {"type": "object", "properties": properties, "required": ["a"]}
    taken, kept_out = take_then_walk(vocab, schema, '{"stamp":"', range(12, 48, 2))
    assert taken and kept_out  # the largest budgets let it in, the least keep it out


def test_a_rollback_past_the_committed_state_forgets_the_draft_rows_checks(vocab):
    """Draft rows' checks are kept by their look-ahead tokens since the last commit; once
    committed tokens are rolled back, the same look-ahead starts from another state, so
    what was checked there must not be taken for it."""
    from tests.closing_walk import allowed, closing_stack

    compiled = compile_now(spec_for({"json_schema": json.dumps(PERSON)}), vocab)
    path = vocab.hf_tokenizer.encode('{"name":"Ada', add_special_tokens=False)
    stack = closing_stack(compiled, vocab, len(path) + 24)  # near: every row is checked
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    assert stack.consume(path[:-2])
    assert stack.try_consume(path[-2:-1]) == 1
    allowed(stack, bitmask, 0, WIDTH)  # a draft row, checked after the look-ahead
    assert stack.track.drafts
    stack.rollback(2)  # the look-ahead and a committed token
    assert stack.track.drafts == {}
    assert stack.consume(path[-3:])  # and it follows the output again from there
    assert allowed(stack, bitmask, 0, WIDTH).size


def test_a_grammars_store_lives_and_dies_with_it(monkeypatch):
    """A grammar's closing tables (``tables_of``) are made once however often a batch asks
    for them, with one finalizer for its store (they would pile up while grammars are
    cached); and a grammar that dies takes its store's rows with it."""
    import gc

    from constrained.grammars import closing_sorts
    from constrained.grammars.closing_sorts import MEMORY, forget_shared_sorts, keep_sort, new_sort
    from constrained.grammars.closing_tables import tables_of

    class Grammar:
        history = False

    registered = []
    finalize = closing_sorts.weakref.finalize
    monkeypatch.setattr(closing_sorts.weakref, "finalize",
                        lambda *a: registered.append(a[-1]) or finalize(*a))  # fmt: skip
    forget_shared_sorts()
    grammars = [Grammar() for _ in range(4)]
    stores = [tables_of(grammar).sorts for grammar in grammars]
    for _ in range(20):
        assert [tables_of(grammar).sorts for grammar in grammars] == stores
        assert all(tables_of(g).sorts is store for g, store in zip(grammars, stores, strict=True))
    assert len(registered) == len(grammars)
    words = np.zeros(words_for(WIDTH), dtype=np.uint32)
    keep_sort(stores[-1], new_sort(words, [1], 9, {1: [1]}, {}, []))
    last = id(stores[-1])
    assert any(slot[0] == last for slot in MEMORY.rows)
    del grammars, stores
    gc.collect()
    assert not any(slot[0] == last for slot in MEMORY.rows) and MEMORY.held == 0


def test_every_grammars_store_holds_its_rows_within_one_memory_bound(monkeypatch):
    """A mixed batch (55 schemas) keeps each grammar's near rows for its later requests
    (``ClosingTables.sorts``: not only the last 2 grammars' rows); what all stores hold together
    stays within ``SHARED_BYTES``, the least recently kept rows going first, and a grammar
    that dies takes its rows' memory with it."""
    import gc

    from constrained.grammars import closing_sorts
    from constrained.grammars.closing_sorts import MEMORY, forget_shared_sorts, keep_sort, new_sort
    from constrained.grammars.closing_tables import tables_of

    class Grammar:
        history = False

    forget_shared_sorts()
    words = np.zeros(words_for(WIDTH), dtype=np.uint32)

    def sort(witness: int, left: int):  # a wide row's sort: most of the row cleared
        return new_sort(words.copy(), [witness], left, {1: [witness]}, {}, np.arange(WIDTH // 2))

    one_row = closing_sorts._row_bytes({9: sort(0, 9)})
    monkeypatch.setattr(closing_sorts, "SHARED_BYTES", 6 * one_row)
    grammars = [Grammar() for _ in range(4)]
    stores = [tables_of(grammar).sorts for grammar in grammars]
    for witness in range(3):  # 3 rows a grammar, 12 in all: the last 6 stay
        for store in stores:
            keep_sort(store, sort(witness, 9))
    held = [(id(store), key) for store in stores for key in store]
    assert len(held) == 6 and MEMORY.held <= closing_sorts.SHARED_BYTES
    assert sorted(key[0][0] for _, key in held) == [1, 1, 2, 2, 2, 2]  # the latest kept
    assert {slot[0] for slot in held} == {id(store) for store in stores}  # 4 grammars' rows
    assert sum(held_bytes for _, held_bytes in MEMORY.rows.values()) == MEMORY.held
    keep_sort(stores[0], sort(2, 12))  # another room of a kept row: counted, not a new row
    assert len(stores[0][((2,), hash(words.tobytes()))]) == 2
    assert MEMORY.held <= closing_sorts.SHARED_BYTES
    before = MEMORY.held
    del grammars, stores
    gc.collect()
    assert before > MEMORY.held and not MEMORY.rows
    forget_shared_sorts()


def _object_of(key: str) -> dict:
    properties = {key: {"type": "string"}}
    return {"type": "object", "properties": properties, "additionalProperties": False}


# Two keys whose rows and witnesses are equal (`":{}}` after either) but whose objects are
# not: a sort checked after ``a`` (``":{"`` kept on ``xylophone":""}}``) is not a check after
# ``b``.
TWO_OBJECTS = {
    "type": "object",
    "properties": {"a": _object_of("xylophone"), "b": _object_of("quartz")},
    "additionalProperties": False,
}


@pytest.mark.parametrize("budget", [12, 13, 14, 16])
def test_a_sort_taken_at_another_state_leaves_no_stale_witness(vocab, budget):
    """Found by ``benchmarks/closing_walks.py`` (MaskBench Github_hard o5411 at need + 8):
    a near row taken again from an earlier one with the same words and witness (its sort,
    ``_sorted_again``) carries suffixes checked at the other state. Followed as the
    witness they led the next row, all its tokens cleared, to keep a token the matcher
    refuses (in the engine: the request ends at end-of-sequence on an incomplete output).
    At every row the witness completes from where the output is, and every allowed token
    is one the matcher takes."""
    from constrained.grammars.closing_sorts import forget_shared_sorts
    from tests.closing_walk import closing_stack

    forget_shared_sorts()
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(TWO_OBJECTS)), vocab)
    encode = vocab.hf_tokenizer.encode
    tokens = encode('{"a":{},"b":{"', add_special_tokens=False)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack = closing_stack(compiled, vocab, budget)
    taken = 0
    for token in [*tokens, None]:
        stack.fill(bitmask, 0)
        if stack.witness is not None:
            assert completes(stack.inner, stack.witness), (budget, taken)
        row = allowed_ids(bitmask[0], WIDTH).nonzero()[0].tolist()
        assert row, (budget, taken)
        for allowed in row:
            if allowed != vocab.eos_token_id:
                assert stack.inner.try_consume([allowed]) == 1, (budget, taken, allowed)
                stack.inner.rollback(1)
        if token is None or token not in row:  # the budget ruled the rest out: closed early
            break
        assert stack.consume([token])
        taken += 1
    assert taken >= 3


def test_the_rise_is_probed_only_once_a_row_comes_within_its_reach(vocab, monkeypatch):
    """A grammar's rise (``ClosingTables.rise``) widens ``reach`` by at most ``MAX_RISE``
    tokens, so a row farther than that from its need is far whatever the rise: the probe
    waits for the first row that comes that near (a request that ends sooner never walks
    it), and every row is the one a layer probed at the start gives, bit for bit."""
    from constrained.grammars.closing_matcher import closing_layer
    from constrained.grammars.closing_tables import MAX_RISE, ClosingTables, tables_of

    probes: list[int] = []
    walk_rise = ClosingTables._walk_rise
    monkeypatch.setattr(
        ClosingTables, "_walk_rise", lambda self, *a: probes.append(1) or walk_rise(self, *a)
    )
    properties = {
        "stamp": {"type": "string", "format": "date-time"},
        "a": {"type": "boolean"},
        "note": {"type": "string"},
    }
    schema = {"type": "object", "properties": properties, "required": ["a"]}
    compiled = compile_now(spec_for({"json_schema": json.dumps(schema)}), vocab)
    path = vocab.hf_tokenizer.encode('{"note":"' + "word " * 120, add_special_tokens=False)
    budget = len(path) + MAX_RISE // 2  # far at first, near by the path's end
    lazy = closing_layer(compiled, vocab, budget, json=True)
    lazy.fill(torch.zeros(1, words_for(WIDTH), dtype=torch.int32), 0)
    assert probes == []  # far: MAX_RISE and more from its need
    eager = closing_layer(compiled, vocab, budget, json=True)
    eager.horizon.reach = max(eager.horizon.reach, tables_of(compiled).rise(vocab))
    eager.rise = None
    assert probes == [1]
    lazy = closing_layer(compiled, vocab, budget, json=True)
    rng = random.Random(0)
    for step in range(budget):
        masks = [mask_of(layer) for layer in (lazy, eager)]
        assert torch.equal(masks[0], masks[1]), step
        allowed = np.flatnonzero(allowed_ids(masks[0][0], WIDTH)).tolist()
        on_path = step < len(path) and path[step] in allowed  # (closing may end the note)
        token = path[step] if on_path else rng.choice(allowed)
        if token == vocab.eos_token_id:
            break
        assert lazy.consume([token]) and eager.consume([token])
    else:
        raise AssertionError("the walk did not end by its budget")
    assert lazy.rise is None  # it came near, and used the rise
    assert probes == [1]  # walked once for the grammar
