"""What closing's checks cost, counted rather than timed: the token classes a free string's
row is checked by, the lookaheads a walk that finds nothing takes, the walks a request
repeats, and how often a request that found no completion walks again (issue #27)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

from constrained.grammars import GrammarSpec, closing_check, compile_now
from constrained.grammars import closing as closing_module
from constrained.grammars.closing import find_witness
from constrained.grammars.closing_check import Checker, Walks
from constrained.grammars.closing_matcher import RECHECK_EVERY, ClosingMatcher
from constrained.grammars.closing_row_sort import RowSorter
from constrained.grammars.matcher import words_for
from constrained.grammars.token_shapes import (
    SEAM_FREE,
    SEAM_OPEN,
    SEAM_WHOLE,
    hex_finish,
    in_free_text,
    open_bytes,
    owed_hex_digits,
    seam_fits,
    text_classes,
    token_classes,
    token_finish,
    utf8_seams,
)
from tests.test_grammar_bookkeeping import WIDTH, vocab

__all__ = ["vocab"]

MASKBENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"

# A pattern read as "starts with allow, or ends with deny": after other text only ``deny``
# then ``"`` closes the string, which no walk's choice of one token at a time reaches.
DENY = {
    "type": "object",
    "properties": {"effect": {"type": "string", "pattern": "^allow|deny$"}},
    "required": ["effect"],
}


def ids(vocab, *pieces: bytes) -> list[int]:
    by_bytes = {piece: token for token, piece in enumerate(vocab.token_bytes()) if piece}
    return [by_bytes[piece] for piece in pieces]


def grammar(vocab, schema: dict):
    return compile_now(GrammarSpec("json_schema", json.dumps(schema)), vocab)


def test_free_text_classes_write_structure_bytes_as_text(vocab):
    """Inside a JSON string ``{}[],:`` are characters like letters: one class for ``a``,
    ``{``, ``,`` and ``hello`` (the structure classes keep them apart); a quote, what
    follows it, and a UTF-8 character cut by the token still make classes of their own."""
    text, structure = text_classes(vocab)[0], token_classes(vocab)[0]
    a, brace, comma, hello, quote, close, lead = ids(
        vocab, b"a", b"{", b",", b"hello", b'"', b'"}', b"\xe0"
    )
    assert text[a] == text[brace] == text[comma] == text[hello]
    assert len({structure[a], structure[brace], structure[comma]}) == 3
    assert len({text[a], text[quote], text[close], text[lead]}) == 4
    # The two maps never share an id: a sort's classes are keyed by one or the other.
    assert not set(text[text >= 0].tolist()) & set(structure[structure >= 0].tolist())


def test_only_a_free_strings_row_is_free_text(vocab):
    """A row is read as free text when it allows each of ``{}[],: a`` as a token: inside a
    plain string yes; between an object's values, and inside a ``uri`` (where ``[::1]:80``
    has structure), no."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string"}, "u": {"type": "string", "format": "uri"}},
        "required": ["s", "u"],
    }
    matcher = grammar(vocab, schema).matcher()
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    encode = vocab.hf_tokenizer.encode

    def free() -> bool:
        matcher.fill(bitmask, 0)
        return in_free_text(vocab, bitmask[0].numpy().view(np.uint32))

    assert not free()
    assert matcher.consume(encode('{"s":"', add_special_tokens=False))
    assert free()
    assert matcher.consume(encode('x","u":"http', add_special_tokens=False))
    assert not free()


def test_a_walk_that_finds_nothing_looks_ahead_a_few_times(vocab, monkeypatch):
    """Inside the string, after text that is not ``allow``, no single token lets the quote
    close it: the walk finds nothing. It looks ahead (up to 256 checks each) for its first
    ``_LOOKAHEAD_MISSES`` steps, then one step in that many (it did at every one of its 114
    steps: 76 ms a walk, every 16 tokens, in a request cut anyway)."""
    matcher = grammar(vocab, DENY).matcher()
    text = vocab.hf_tokenizer.encode('{"effect":"\' string', add_special_tokens=False)
    assert matcher.consume(text)
    looks = []
    closing_next = closing_module._closing_next
    monkeypatch.setattr(
        closing_module,
        "_closing_next",
        lambda *args: looks.append(1) or closing_next(*args),
    )
    assert find_witness(matcher, vocab, 55) is None
    steps = 2 * 55 + 4
    misses = closing_module._LOOKAHEAD_MISSES
    assert 0 < len(looks) <= misses + steps // misses
    # A pattern whose close one token reaches is still closed by the lookahead.
    ends = {**DENY, "properties": {"effect": {"type": "string", "pattern": "^.*q$"}}}
    other = grammar(vocab, ends).matcher()
    assert other.consume(vocab.hf_tokenizer.encode('{"effect":"ab', add_special_tokens=False))
    found = find_witness(other, vocab, 8)
    assert found is not None
    assert b"".join(vocab.token_bytes()[t] for t in found).startswith(b'q"')


@pytest.mark.parametrize("count", [0, 5, 1024, 1025, 5000, 140_000])
def test_cleared_tokens_as_bits_whether_few_or_most(count):
    """A near row's cleared tokens, few (bits set one by one) or most of the vocabulary
    (packed from booleans), clear exactly those bits of the row."""
    from constrained.grammars.closing_sorts import Cleared, _set_bits

    rng = np.random.default_rng(count)
    words = words_for(WIDTH)
    cleared = np.sort(rng.choice(WIDTH, count, replace=False)).astype(np.int64)
    flags = np.zeros(words * 32, dtype=bool)
    flags[cleared] = True
    assert np.array_equal(_set_bits(np.zeros(words, np.uint32), cleared), np.packbits(
        flags, bitorder="little").view(np.uint32))  # fmt: skip
    row = rng.integers(0, 2**32, words, dtype=np.uint64).astype(np.uint32)
    expected = np.unpackbits(row.view(np.uint8), bitorder="little").astype(bool)
    expected[cleared] = False
    Cleared(cleared[: count // 2], words).plus(cleared[count // 2 :].tolist(), words).apply(row)
    assert np.array_equal(np.unpackbits(row.view(np.uint8), bitorder="little"), expected)


@pytest.mark.parametrize("kind", ["json_schema", "regex"])
def test_a_looking_walk_that_finds_nothing_is_walked_once(vocab, monkeypatch, kind):
    """A walk that finds nothing is walked again without JSON's literals as shortcuts
    (``true``, ``null``), which outside JSON mislead. A walk that only looks for more than
    the row needs (a check's, a shorter witness's) is walked once where it finds nothing,
    in any grammar: in the engine's batch of 55 MaskBench schemas the second walk was a
    fifth of closing's fill and found a shorter completion once in 236; in a pass of 30
    tool calls none of 162 failed walks found one the second time. Outside a JSON schema
    one that found a completion with literals is walked again for a shorter one (16 of 26
    a pass did). A walk for the witness itself, which keeps the output from being cut,
    still takes both. The request's ``kind`` decides it when its stack is built."""
    from concurrent.futures import Future

    from constrained.grammars.stack import build_stack

    compiled: Future = Future()
    compiled.set_result(grammar(vocab, DENY))
    stack = build_stack(compiled, vocab, 64, kind=kind).matcher
    assert stack.checker.json is (kind == "json_schema")
    text = vocab.hf_tokenizer.encode('{"effect":"\' string', add_special_tokens=False)
    assert stack.consume(text)
    walked = []
    real = closing_check.find_witness
    monkeypatch.setattr(
        closing_check, "find_witness", lambda *a, **k: walked.append(1) or real(*a, **k)
    )
    assert stack.checker.walk(8, looking=True) is None  # after other text only "deny" closes
    assert len(walked) == 1
    walked.clear()
    assert stack.checker.walk(8) is None
    assert len(walked) == 2


def test_every_token_cut_inside_a_character_has_bytes_that_finish_it(vocab):
    """``token_finish``: for every token that ends inside a UTF-8 character, tokens whose
    bytes finish it (the lead byte's own range: ``\\xe0`` needs ``\\xa0`` or more, ``\\xed``
    less), as few as the vocabulary allows (one token of all the bytes owed where there is
    one, so ``\\xe0`` takes one token, never two); for one that opens an escape, ``"``.
    Tried after it before any walk."""
    pieces = vocab.token_bytes()
    cut = [t for t, piece in enumerate(pieces) if piece and open_bytes(piece)]
    assert len(cut) > 1000
    for token in cut:
        piece, finish = pieces[token], token_finish(vocab, token)
        lead = max(k for k in range(len(piece)) if piece[k] & 0xC0 != 0x80)
        if piece[lead] in (0xC0, 0xC1) or piece[lead] >= 0xF5:  # no character starts so
            assert finish == ()
            continue
        owed = open_bytes(piece)
        assert 1 <= len(finish) <= owed
        assert sum(len(pieces[t]) for t in finish) == owed
        (piece[lead:] + b"".join(pieces[t] for t in finish)).decode()  # a whole character
        if owed > 1:  # the vocabulary has a token of two continuation bytes for every lead
            assert len(finish) < owed, (piece, [pieces[t] for t in finish])
    a, slash, escaped, quote = ids(vocab, b"a", b"\\", b"\\\\", b'"')
    assert token_finish(vocab, a) == () and token_finish(vocab, escaped) == ()
    assert token_finish(vocab, slash) == (quote,)  # an escape opened: \"


@pytest.mark.parametrize(
    ("text", "owed"),
    [(b"#\\uD", 3), (b"\\u", 4), (b"x\\u12a", 1), (b"\\\\uD", 0), (b"\\\\\\u1", 3),
     (b"\\uDACE", 0), (b"plain", 0)],
)  # fmt: skip
def test_an_escape_split_across_tokens_owes_its_hex_digits(vocab, text, owed):
    """A ``\\u`` escape can span tokens (``#\\`` then ``uD``), so no one token's finish
    (``token_finish``) knows the digits it owes: the output's last bytes do (a backslash
    escaped by another opens nothing). The fewest tokens writing them come first."""
    assert owed_hex_digits(text) == owed
    finish = hex_finish(vocab, owed)
    written = b"".join(vocab.token_bytes()[t] for t in finish)
    assert len(written) == owed and all(chr(b) in "0123456789abcdefABCDEF" for b in written)
    assert len(finish) == (owed > 0)  # Qwen writes up to four hex digits in one token


def test_a_near_row_walks_for_no_token_cut_inside_a_character(vocab, monkeypatch):
    """A near row inside a string checks each class of tokens that end inside a UTF-8
    character by the bytes that finish one (and remembers what walks found, as bridges,
    for the next rows): none of them is walked from."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }
    compiled = grammar(vocab, schema)
    prefix = vocab.hf_tokenizer.encode('{"a":"x', add_special_tokens=False)
    rest = find_witness(compiled.matcher(), vocab, 64)
    assert rest is not None
    stack = ClosingMatcher(compiled.matcher(), vocab, len(prefix) + len(rest) + 4, [rest])
    assert stack.consume(prefix)
    walked = []
    check = Checker.check

    def counted(self, token, witness, left, safe, walks, key=None):
        before = walks.left
        found = check(self, token, witness, left, safe, walks, key)
        if walks.left != before:
            walked.append(token)
        return found

    monkeypatch.setattr(Checker, "check", counted)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack.fill(bitmask, 0)
    pieces = vocab.token_bytes()
    row = np.flatnonzero(closing_module.allowed_ids(bitmask[0], WIDTH))
    assert any(open_bytes(pieces[t]) for t in row.tolist())  # kept: they finish in time
    assert not [t for t in walked if token_finish(vocab, t)]  # nor one opening an escape


def test_a_suffix_skipped_at_a_utf8_seam_is_one_the_matcher_refuses(vocab, monkeypatch):
    """``seam_fits`` over generated pairs inside a free string: a token that ends inside a
    character it starts (``SEAM_OPEN``) followed by text that does not continue it, or a
    token whose last character is whole followed by a continuation byte, is never
    accepted by the matcher; so the checks that skip them (``Checker.check``) keep the
    same tokens in a JSON schema's grammar. Every kind is drawn, and each pair it rules out
    is tried."""
    compiled = grammar(vocab, {"type": "string"})
    matcher = compiled.matcher()
    assert matcher.consume(ids(vocab, b'"'))  # inside the string: free text
    kinds, continues = utf8_seams(vocab)
    pieces = vocab.token_bytes()
    quote, a = ids(vocab, b'"', b"a")
    lead, tail = ids(vocab, b"\xe0", b"\xbb\xbf")  # a lead byte, two continuation bytes
    assert (kinds[lead], kinds[a], kinds[tail]) == (SEAM_OPEN, SEAM_WHOLE, SEAM_FREE)
    assert continues[tail] and not continues[a]
    assert not seam_fits(SEAM_OPEN, continues, [quote]) and seam_fits(SEAM_OPEN, continues, [tail])
    assert not seam_fits(SEAM_WHOLE, continues, [tail, quote]) and seam_fits(
        SEAM_FREE, continues, [tail]
    )
    rng = np.random.default_rng(0)
    texts = [t for t, piece in enumerate(pieces) if piece and b"\\" not in piece]
    suffixes = [[t, quote] for t in rng.choice(texts, 300).tolist()] + [[quote], []]
    refused = 0
    for token in rng.choice(texts, 300).tolist():
        kind = int(kinds[token])
        for suffix in suffixes:
            if not seam_fits(kind, continues, suffix):
                refused += 1
                assert not matcher.completes([token, *suffix]), (pieces[token], suffix)
    assert refused > 1000
    # and, in a JSON schema's grammar, a suffix learnt after a lead byte is not tried after
    # plain text; in other grammars (a Lark ``~`` may match invalid UTF-8) every one is
    tried = []
    real = closing_module.completes
    monkeypatch.setattr(
        closing_check, "completes", lambda m, tokens: tried.append(list(tokens)) or real(m, tokens)
    )
    for as_json in (True, False):
        stack = ClosingMatcher(compiled.matcher(), vocab, 64, json=as_json)
        assert stack.consume([quote])
        stack.memory.learn(lead, None, [tail, quote], [quote])
        tried.clear()
        stack.checker.check(a, [quote], 8, {}, Walks())
        stack.checker.check(lead, [quote], 8, {}, Walks())
        assert [lead, tail, quote] in tried
        skipped = [a, tail, quote] not in tried and [lead, quote] not in tried
        assert skipped == as_json


def test_a_bridge_is_tried_with_a_later_rows_witness(vocab):
    """What a walk took after a token before the witness completed is kept as the token's
    (and its class's) bridge, and a later check puts it before that row's witness."""
    compiled = grammar(vocab, {"type": "string"})
    stack = ClosingMatcher(compiled.matcher(), vocab, 64)
    token, x, y, w1, w2, w3 = ids(vocab, b"\\", b"n", b"m", b'"', b"}", b"]")
    stack.memory._bridge(token, 7, [x, y, w1, w2], [w1, w2])
    bridges = stack.memory.bridges
    assert bridges[-1 - token] == ((x, y), 0) and bridges[7] == ((x, y), 0)
    tries = [suffix for suffix, _ in stack.checker._tries(token, [w3, w1], 7)]
    assert [x, y, w3, w1] in tries
    stack.memory._bridge(token, None, [x, w1], [w2, w1])  # before the witness's tail
    assert stack.memory.bridges[-1 - token] == ((x,), 1)


def test_a_request_that_found_no_completion_walks_again_ever_later(vocab, monkeypatch):
    """After a walk from the output's state finds nothing, the next one waits
    ``RECHECK_EVERY`` tokens, then twice that, and so on (a walk that finds nothing runs to
    its room)."""
    compiled = grammar(vocab, DENY)
    stack = ClosingMatcher(compiled.matcher(), vocab, 120, [])
    encode = vocab.hf_tokenizer.encode
    assert stack.consume(encode('{"effect":"\' string', add_special_tokens=False))
    counts = []
    walk = Checker.walk
    monkeypatch.setattr(
        Checker, "walk", lambda self, *a: counts.append(stack.count) or walk(self, *a)
    )
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    word = encode(" word", add_special_tokens=False)
    for _ in range(80):
        stack.fill(bitmask, 0)
        assert stack.consume(word)
    first = counts[0]
    assert counts[:3] == [first, first + RECHECK_EVERY, first + 3 * RECHECK_EVERY]


def _count_walks(monkeypatch) -> list[tuple]:
    """The arguments of every ``Checker.walk`` from here on (the test's)."""
    walks: list[tuple] = []
    real_walk = Checker.walk

    def counted(self, *args, **kwargs):
        walks.append(args)
        return real_walk(self, *args, **kwargs)

    monkeypatch.setattr(Checker, "walk", counted)
    return walks


def test_with_no_slack_a_shorter_witness_is_looked_for_once(vocab, monkeypatch):
    """Where the room left equals the witness's length (no slack), only tokens completing as
    shortly as the witness stay: a witness followed from far away that is longer than
    need be (``"`` ``}`` where ``"}`` also completes) would clear every text token. One walk
    finds the shorter one, and text stays allowed; the walk runs once along a witness."""
    from tests.closing_walk import allowed

    stack, bitmask = _inside_k_with_a_long_witness(vocab, 6)
    close, text = ids(vocab, b'"}', b"a")
    assert stack.left == 3
    walks = _count_walks(monkeypatch)
    row = allowed(stack, bitmask, 0, WIDTH)
    assert stack.witness == [close] and walks[0] == (1,)
    assert text in row and close in row  # "a" then '"}' completes in the 3 tokens left
    walks.clear()
    allowed(stack, bitmask, 0, WIDTH)
    assert (1,) not in walks  # not again along the same witness


def test_with_one_token_of_slack_a_shorter_witness_is_looked_for_too(vocab):
    """One token of slack (the room equals the witness's length) is as tight for a token
    that owes one more: ``\\xc2`` needs a continuation byte, ``\\`` the rest of its escape,
    so with the witness ``"`` ``}`` (followed from far away) their completions take one token
    more than the room, and they were cleared (MaskBench calculate_taxes, 7 of 24 verified
    clears needless). The walk for a shorter witness runs there too: ``"}`` leaves room for
    the finish, and both stay allowed."""
    from tests.closing_walk import allowed

    stack, bitmask = _inside_k_with_a_long_witness(vocab, 7)
    close, lead, slash = ids(vocab, b'"}', b"\xc2", b"\\")
    assert stack.left == 4
    row = allowed(stack, bitmask, 0, WIDTH)
    assert stack.witness == [close]
    assert lead in row and slash in row  # '\xc2' '\xa0' '"}', '\' '"' '"}': 3 + end


def _narrow_rows(vocab, monkeypatch, schema, prefix, witnesses, left):
    """For each witness (bytes of its tokens, as one followed from far away would be): a
    fresh closing stack after ``prefix`` with ``left`` tokens left and that witness, its
    row's allowed pieces, the walks it took, and its witness after the row."""
    from tests.closing_walk import allowed, closing_stack

    walks = _count_walks(monkeypatch)
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema), "llguidance"), vocab)
    out = []
    for witness in witnesses:
        stack = closing_stack(compiled, vocab, len(prefix) + left)
        assert stack.consume(prefix)
        stack.track.commit(ids(vocab, *witness))
        assert stack.inner.completes(stack.witness) and stack.left == left
        walks.clear()
        bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
        row = allowed(stack, bitmask, 0, WIDTH)
        pieces = sorted(vocab.token_bytes()[token] for token in row)
        out.append((pieces, list(walks), [vocab.token_bytes()[t] for t in stack.witness]))
    return out


ENUM = {"type": "object", "required": ["k"], "additionalProperties": False,
        "properties": {"k": {"enum": ["ab", "bb", "ccc", "done"]}}}  # fmt: skip


TWO_STRINGS = {"type": "object", "required": ["k", "m"], "additionalProperties": False,
               "properties": {"k": {"type": "string"}, "m": {"type": "string"}}}  # fmt: skip


def test_a_free_text_state_walks_for_a_shorter_witness_once(vocab, monkeypatch):
    """Inside a free string, equal rows and witnesses stand for equal states (the premise
    ``_sorted_again`` keeps): after text that leaves the row and the witness as they were,
    the walk for a shorter witness that found none is not run again (an engine's batch
    of 55 MaskBench schemas at ``max_tokens`` 64: 54 of 132 such walks were repeats, none
    found one). The row is the one a stack that walks again writes."""
    from tests.closing_walk import allowed, closing_stack

    compiled = grammar(vocab, TWO_STRINGS)
    prefix = ids(vocab, b'{"', b"k", b'":"')
    matcher = compiled.matcher()
    assert matcher.consume(prefix)
    witness = find_witness(matcher, vocab, 32)
    assert witness is not None and len(witness) > 1  # ``","`` ``m`` ``":""}``: the shortest
    text = ids(vocab, b"a")[0]
    rows = []
    for memo in (True, False):
        stack = closing_stack(compiled, vocab, len(prefix) + len(witness) + 2)
        assert stack.consume(prefix)
        stack.track.commit(list(witness))
        bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
        walks = _count_walks(monkeypatch)
        first = allowed(stack, bitmask, 0, WIDTH)
        assert (len(witness) - 1,) in walks and stack.witness == witness  # none shorter
        assert text in first and stack.consume([text])  # one token of slack: text stays
        assert not stack.track.shortest_tried  # off the witness: walked again, but for the memo
        if not memo:
            stack.track.no_shorter = None
        walks.clear()
        rows.append(allowed(stack, bitmask, 0, WIDTH).tolist())
        assert ((len(witness) - 1,) in walks) is not memo and stack.witness == witness
        monkeypatch.undo()
    assert rows[0] == rows[1] and witness[0] in rows[0]


@pytest.mark.parametrize("left", [5, 6])
def test_a_narrow_row_walks_for_a_shorter_witness_only_if_its_sort_clears(vocab, monkeypatch, left):
    """A narrow row (at most ``EXACT_MAX`` tokens: an enum's first tokens) with no slack, or
    one token of it, walks after each of its tokens in its sort: the walk for a shorter
    witness waits for a token the sort clears. Every value fits here, so none is walked
    for (each walk is a token's, with joins), and the row is the one a stack given the
    shortest witness writes. With a value too long to fit, the walk runs once."""
    prefix = ids(vocab, b'{"', b"k", b'":"')
    long, short = [b"a", b"b", b'"', b"}"], [b"ab", b'"}']
    (row, walks, _), (shortest, _, _) = _narrow_rows(
        vocab, monkeypatch, ENUM, prefix, [long, short], left
    )
    assert walks and all(len(args) == 2 for args in walks)
    assert row == shortest and {b"ab", b"bb", b"ccc", b"done"} <= set(row)
    values = [*ENUM["properties"]["k"]["enum"], "xylophones quietly humming zebras"]
    longer = {**ENUM, "properties": {"k": {"enum": values}}}
    (row, walks, witness), (shortest, _, _) = _narrow_rows(
        vocab, monkeypatch, longer, prefix, [long, short], left
    )
    assert [args for args in walks if len(args) == 1] == [(len(long) - 1,)]
    assert row == shortest and b"done" in row and witness == short


def test_a_narrow_row_keeps_what_a_shorter_witness_keeps(vocab, monkeypatch):
    """Found in review: inside a key, a witness followed from far away (``":`` ``2`` ``}}``)
    where ``":""`` ``}}`` also completes. With no slack, ``"``'s known suffix, the witness's
    text after it (``:`` ``2`` ``}}``), completes but is too long, so its check ends without
    a walk and the sort clears it; the walk for a shorter witness then runs, and the row
    is sorted again from ``":""`` ``}}``: ``"`` stays, as that stack's row keeps it."""
    schema = {"type": "object", "required": ["a"], "additionalProperties": False,
              "properties": {"a": {"type": "object", "properties": {"k": {}}, "required": ["k"],
                                   "additionalProperties": False}}}  # fmt: skip
    prefix = vocab.hf_tokenizer.encode('{"a":{"k', add_special_tokens=False)
    far, short = [b'":', b"2", b"}}"], [b'":""', b"}}"]
    (row, _, witness), (shortest, _, _) = _narrow_rows(
        vocab, monkeypatch, schema, prefix, [far, short], len(far) + 1
    )
    assert b'"' in row and row == shortest and witness == short


def _inside_k_with_a_long_witness(vocab, budget: int):
    """A closing stack at ``budget`` inside ``{"k":"``, its witness set to ``"`` ``}`` (as
    one followed from far away would be), where ``"}`` completes in one token; and a
    one-row bitmask."""
    from tests.closing_walk import closing_stack

    schema = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"],
              "additionalProperties": False}  # fmt: skip
    compiled = compile_now(GrammarSpec("json_schema", json.dumps(schema), "llguidance"), vocab)
    stack = closing_stack(compiled, vocab, budget)
    assert stack.consume(ids(vocab, b'{"', b"k", b'":"'))
    quote, brace = ids(vocab, b'"', b"}")
    assert stack.inner.completes([quote, brace])
    stack.track.commit([quote, brace])
    return stack, torch.zeros(1, words_for(WIDTH), dtype=torch.int32)


def test_an_enum_row_keeps_each_value_whose_forced_rest_fits(vocab):
    """Found by ``benchmarks/closing_walks.py`` (MaskBench o4050, an enum of 500 licence ids,
    ``max_tokens`` 12): the first row after ``"`` allows 346 tokens, checked by class (runs
    of letters are one class); the class's ends did not finish in time, 8 members and the
    witness's were checked, and the rest cleared: 1 kept, where ``Cu`` finishes in 2. A row
    of structure, not free text, now checks those members by what the grammar forces after
    each (an enum value's rest): every token whose forced rest completes in time stays."""
    path = MASKBENCH / "Github_trivial---o4050.json"
    if not path.exists():
        pytest.skip("MaskBench is not here")
    compiled = grammar(vocab, json.loads(path.read_text())["schema"])
    bitmask = torch.zeros(2, words_for(WIDTH), dtype=torch.int32)
    from tests.closing_walk import allowed, closing_stack

    stack, off = closing_stack(compiled, vocab, 12), compiled.matcher()
    for matcher in (stack, off):
        allowed(matcher, bitmask, 0, WIDTH)
        assert matcher.consume(ids(vocab, b'"'))
    free = allowed(off, bitmask, 0, WIDTH)
    kept = allowed(stack, bitmask, 1, WIDTH)
    assert free.size > 64 and not in_free_text(vocab, bitmask[0].numpy().view(np.uint32))
    assert stack.left == 11
    finish = []  # tokens after which the grammar forces a completion that fits
    for token in free.tolist():
        assert off.try_consume([token]) == 1
        rest = off.forced()
        if len(rest) + 2 <= stack.left and off.completes(rest):
            finish.append(token)
        off.rollback(1)
    assert len(finish) > 100
    assert np.isin(finish, kept).all()
    for token in finish:  # each kept with a suffix of its own that completes in time
        suffix = stack.track.safe[token]
        assert len(suffix) + 2 <= stack.left and off.completes([token, *suffix])
    assert kept.size < free.size  # still narrowed: the ids too long for 11 tokens go
    # Where the forced rest stops short (``EC`` forces ``L-``, then ``1.0"`` is one value of
    # two), a walk from after the token (``FORCED_WALK_MASKS`` a row) keeps it too.
    walked = np.setdiff1d(kept, finish).tolist()
    assert len(walked) > 32
    for token in walked:
        suffix = stack.track.safe[token]
        assert len(suffix) + 2 <= stack.left and off.completes([token, *suffix])


# An array of at least 8 objects whose free keys take an integer or a one-key object: from
# inside a key the witness is ``":`` ``1`` ``}`` then the other seven objects.
FREE_KEYS = {
    "type": "array",
    "minItems": 8,
    "items": {
        "type": "object",
        "additionalProperties": {
            "anyOf": [
                {"type": "integer"},
                {"type": "object", "properties": {"z": {"type": "integer"}}, "required": ["z"],
                 "additionalProperties": False},
            ]
        },
    },
}  # fmt: skip


def test_a_checks_walk_ends_on_the_witness_tail_after_the_value(vocab):
    """After ``":{"`` inside a key the witness (``":`` ``1`` ``}``...) no longer completes,
    nor its tail after the first token; the rest of the array does, once the object value
    is closed. A check's walk tries the witness's tails from each ``,`` ``}`` ``]`` it
    reaches (``_joins``), so it writes ``z":1}`` and ends on the witness's own tail: a few
    masks, counted against the row's walk budget as such (MaskBench o81602 at 256 tokens:
    walks of 70 masks each ran a wide row's budget out and cleared tokens that fit)."""
    from constrained.grammars.closing_check import WALK_TOKENS
    from tests.closing_walk import closing_stack

    compiled = compile_now(GrammarSpec("json_schema", json.dumps(FREE_KEYS), "llguidance"), vocab)
    stack = closing_stack(compiled, vocab, 80)
    assert stack.consume(ids(vocab, b"[", b'{"', b"key"))
    witness = find_witness(stack.inner, vocab, 64)
    assert witness is not None and len(witness) > 12
    (opener,) = ids(vocab, b'":{"')
    joins = stack.checker.spelling.joins(witness)
    assert joins[:2] == [witness, witness[1:]] and len(joins) > 2
    pieces = vocab.token_bytes()
    text = b"".join(pieces[t] for t in witness)
    assert all(text.endswith(b"".join(pieces[t] for t in j)) for j in joins)
    walks, safe = Walks(), {}
    found = stack.checker.check(opener, witness, stack.left, safe, walks)
    assert found is not None and stack.inner.completes([opener, *found])
    assert WALK_TOKENS - walks.left < len(found) // 2  # z ": 1 } and the tail's: not all
    assert safe[opener] == found


NESTED_FREE_KEYS = {
    "type": "object",
    "properties": {
        "inner": {"type": "object"},
        "code": {"type": "string", "pattern": "^[a-f0-9]{24}$"},
        "id": {"type": "integer"},
    },
    "required": ["inner", "code", "id"],
    "additionalProperties": False,
}


def test_a_checks_walk_joins_the_witness_inside_its_tokens(vocab):
    """Inside a free key of a nested object the witness closes it with one token, ``},"``.
    A walk after ``":[{"`` closes the array with ``]}`` and goes on from inside that token:
    the witness's text from its ``,`` (``,"code":...``, as the tokenizer writes it) is a
    join too, so the walk takes a few masks, not the 29 of writing the rest itself (MaskBench
    o81602 at 256 tokens cleared ``":-`` ``":[-`` ``":[{"`` when such walks ran a wide row's
    budget out)."""
    from constrained.grammars.closing_check import WALK_TOKENS
    from tests.closing_walk import closing_stack

    spec = GrammarSpec("json_schema", json.dumps(NESTED_FREE_KEYS), "llguidance")
    stack = closing_stack(compile_now(spec, vocab), vocab, 120)
    assert stack.consume(ids(vocab, b'{"', b"inner", b'":{"', b"key"))
    witness = find_witness(stack.inner, vocab, 100)
    pieces = vocab.token_bytes()
    assert witness is not None and pieces[witness[1]] == b'},"'  # the boundary inside a token
    for opener in ids(vocab, b'":[{"', b'":[', b'":-'):
        walks, safe = Walks(), {}
        found = stack.checker.check(opener, witness, stack.left, safe, walks)
        assert found is not None and stack.inner.completes([opener, *found])
        assert WALK_TOKENS - walks.left <= 4, pieces[opener]


def test_a_walks_find_serves_tokens_that_begin_the_same_way(vocab):
    """A completion a walk found after one token (``":{"`` then ``z":1}``...) is tried,
    as text, for a token that writes its first bytes (``":`` then ``{"z":1}``...: the
    rest of the text as the tokenizer writes it), checked by the matcher like any known
    suffix (``":["`` after a walk from ``":[``, MaskBench o81602)."""
    from tests.closing_walk import closing_stack

    compiled = compile_now(GrammarSpec("json_schema", json.dumps(FREE_KEYS), "llguidance"), vocab)
    stack = closing_stack(compiled, vocab, 80)
    assert stack.consume(ids(vocab, b"[", b'{"', b"key"))
    opener, colon = ids(vocab, b'":{"', b'":')
    witness = find_witness(stack.inner, vocab, 64)
    assert stack.checker.check(opener, witness, stack.left, {}, Walks()) is not None
    tried = list(stack.memory.realigned(colon, stack.checker.spelling))
    assert tried and all(stack.inner.completes([colon, *rest]) for rest in tried)


def test_the_witness_text_after_a_token_keeps_the_tags_end_token(vocab):
    """In a tool call's tag the witness ends with ``</tool_call>``, a special token that
    writes no bytes. A token that writes the witness's first bytes (``"`` against
    ``"name``) is checked on the rest of the witness's text as the tokenizer writes it
    with that end token kept (``Spelling.rest``): found without a walk, and it completes
    (before, the text alone lost the end, and 8 of 10 of a tool pair's riser walks were
    for such tokens)."""
    from constrained.grammars.closing_check import WALK_TOKENS
    from constrained.options import Options
    from tests.closing_walk import closing_stack
    from tests.test_structural_tag import vllm_tag

    weather = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    tag = Options(structural_tag=vllm_tag("hermes", "required", weather)).structural_tag
    stack = closing_stack(
        compile_now(GrammarSpec("structural_tag", tag, "xgrammar"), vocab), vocab, 80
    )
    pieces = vocab.token_bytes()
    root = find_witness(stack.inner, vocab, 70)
    assert root is not None and pieces[root[-1]] == b""  # ``</tool_call>``, as a token
    assert stack.consume(root[:2])  # ``<tool_call>`` ``{``
    witness = find_witness(stack.inner, vocab, 70)
    assert witness is not None and pieces[witness[0]] == b'"name'
    (quote,) = ids(vocab, b'"')
    walks = Walks()
    found = stack.checker.check(quote, witness, stack.left, {}, walks)
    assert found is not None and found[-1] == root[-1]
    assert walks.left == WALK_TOKENS  # no walk
    assert closing_module.completes(stack.inner, [quote, *found])


def test_a_rest_spelt_from_inside_a_token_keeps_tokens_without_bytes(vocab):
    """``Spelling.rest``: text from a byte on as the tokenizer writes it, each token that
    writes no bytes kept where it stands; the same as spelling the text alone where every
    token writes bytes."""
    from constrained.grammars.closing_spelling import Spelling, text_and_bounds

    spelling, pieces = Spelling(vocab), vocab.token_bytes()
    end = vocab.eos_token_id
    assert pieces[end] == b""
    tokens = ids(vocab, b'{"', b"name", b'":', b"1", b"}")
    text, bounds = text_and_bounds(pieces, tokens)
    middle = len(pieces[tokens[0]] + pieces[tokens[1]])  # where the inner end stands
    with_ends = [end, *tokens[:2], end, *tokens[2:], end]
    text_with_ends, bounds_with_ends = text_and_bounds(pieces, with_ends)
    assert text_with_ends == text and bounds_with_ends[middle] == 3  # the fewest before
    for at in range(1, len(text)):
        assert spelling.rest(tokens, text, bounds, at) == spelling.spelt(text[at:])
        if at <= middle:  # (the inner end stands at ``middle``: after the text before)
            kept = [*spelling.spelt(text[at:middle]), end, *spelling.spelt(text[middle:]), end]
        else:
            kept = [*spelling.spelt(text[at:]), end]
        assert spelling.rest(with_ends, text, bounds_with_ends, at) == kept


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("ches", "writes the key's first bytes, ending inside a witness token"),
        ("x\xe4", "ends inside a UTF-8 character of the value's text"),
    ],
)
def test_the_witness_follows_an_off_witness_token_without_a_walk(vocab, monkeypatch, written, why):
    """A token off the witness that still writes its text (``ches`` where the witness spells
    ``chess``), or ends inside a character of a free string, leaves the witness known from
    what is at hand: the rest of its text as the tokenizer writes it, or the bytes that
    finish the character before it; no walk, and the witness completes."""
    schema = {
        "type": "object",
        "properties": {"chess_club_details": {"type": "string"}},
        "required": ["chess_club_details"],
    }
    compiled = grammar(vocab, schema)
    pieces = vocab.token_bytes()
    root = find_witness(compiled.matcher(), vocab, 64)
    assert root is not None
    stack = ClosingMatcher(compiled.matcher(), vocab, 64, [root])
    opening = '{"' if written == "ches" else '{"chess_club_details":"'
    stack.track.witness = stack.track.known()  # the root, as a near row commits it
    assert stack.consume(vocab.hf_tokenizer.encode(opening, add_special_tokens=False))
    stack.track.witness = stack.track.known()
    assert stack.witness is not None
    text = written.encode()
    by_bytes = {piece: token for token, piece in enumerate(pieces) if piece}
    if written == "ches":
        taken = [by_bytes[text]]
        assert b"".join(pieces[t] for t in stack.witness).startswith(text)
        assert taken[0] not in stack.witness  # off the witness's own tokens
    else:
        taken = [by_bytes[b"x"], by_bytes[b"\xe4"]]
    walked = []
    monkeypatch.setattr(Checker, "walk", lambda self, *a: walked.append(a))
    for token in taken:
        assert stack.consume([token]), why
    found = stack.track.known()
    assert found is not None and not walked, why
    assert closing_module.completes(stack.inner, found)


def test_a_near_row_of_the_witness_first_token_alone_is_not_sorted(vocab, monkeypatch):
    """A near row that allows one token, the witness's next (a key's next piece), is the
    witness's own check: nothing is sorted and the row is left as the grammar wrote it."""
    schema = {
        "type": "object",
        "properties": {"chess_club_details": {"type": "string"}},
        "required": ["chess_club_details"],
    }
    compiled = grammar(vocab, schema)
    root = find_witness(compiled.matcher(), vocab, 64)
    assert root is not None
    pieces = vocab.token_bytes()
    inside = next(k for k in range(1, len(root)) if not pieces[root[k]].startswith(b'"'))
    stack = ClosingMatcher(compiled.matcher(), vocab, len(root) + 1, [root])  # no slack
    assert stack.consume(root[:inside])  # inside the key: one token goes on
    sorted_rows = []
    sort = RowSorter.sort_tokens
    monkeypatch.setattr(
        RowSorter, "sort_tokens", lambda self, *a: sorted_rows.append(a) or sort(self, *a)
    )
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack.fill(bitmask, 0)
    row = np.flatnonzero(closing_module.allowed_ids(bitmask[0], WIDTH)).tolist()
    assert row == [root[inside]]
    assert not sorted_rows
    assert stack.track.safe == {root[inside]: root[inside + 1 :]}


NOTE = {  # a free string with a member after it: the witness inside it takes a few tokens
    "type": "object",
    "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["note", "n"],
    "additionalProperties": False,
}


def _inside_a_note(vocab, compiled) -> ClosingMatcher:
    """A stack that took ``{"note":"x`` of ``NOTE`` (the shared store emptied), with room
    for the witness from there and end-of-sequence, nothing more."""
    from constrained.grammars.closing_sorts import forget_shared_sorts

    forget_shared_sorts()
    prefix = vocab.hf_tokenizer.encode('{"note":"x', add_special_tokens=False)
    matcher = compiled.matcher()
    assert matcher.consume(prefix)
    inside = find_witness(matcher, vocab, 64)
    rest = find_witness(compiled.matcher(), vocab, 64)
    assert rest is not None and inside is not None
    stack = ClosingMatcher(compiled.matcher(), vocab, len(prefix) + 2 + len(inside), [rest])
    assert stack.consume(prefix)
    return stack


def _no_slack_text_row(vocab, compiled, monkeypatch, remembered: tuple[int, ...] = ()):
    """A stack inside ``NOTE``'s free string: its row sorted once, one plain token taken,
    then the row sorted from scratch with no slack (the witness takes all the room but
    end-of-sequence), the tokens that second row checks recorded. ``remembered``: tokens
    given a suffix of their own first (``recent``, as a walk's find after them leaves).
    The stack, the row, the tokens checked."""
    stack = _inside_a_note(vocab, compiled)
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack.fill(bitmask, 0)
    assert stack.consume(ids(vocab, b"y"))
    for token in remembered:
        stack.memory.recent[token] = list(stack.track.known())
    checked: list[int] = []
    check = Checker.check

    def counted(self, token, witness, left, safe, walks, key=None):
        checked.append(token)
        return check(self, token, witness, left, safe, walks, key)

    monkeypatch.setattr(Checker, "check", counted)
    monkeypatch.setattr(RowSorter, "sorted_again", lambda self, *a: None)
    stack.fill(bitmask, 0)
    monkeypatch.undo()
    assert stack.left - 2 == len(stack.witness) - 1
    row = np.flatnonzero(closing_module.allowed_ids(bitmask[0], WIDTH)).tolist()
    return stack, row, checked


def test_a_free_text_class_whose_ends_fail_checks_no_other_member(vocab, monkeypatch):
    """No slack inside a free string: a class whose shortest and longest members both fail
    is cleared without checking the members between (they differ only in their plain run's
    length; a string's ``minLength`` or ``maxLength`` orders them), except a member with a
    suffix of its own (its ends do not try that); the witness's first token stays, and
    the row keeps only what completes in time."""
    compiled = grammar(vocab, NOTE)
    stack, row, checked = _no_slack_text_row(vocab, compiled, monkeypatch)
    classes = text_classes(vocab)[0]
    hello = ids(vocab, b"hello")[0]
    plain = int(classes[hello])  # the largest class: its ends fail
    assert sum(1 for token in checked if classes[token] == plain) == 2
    assert stack.witness[0] in row and len(row) < 16
    for token in row:  # each with its own suffix or its class's
        suffix = stack.track.safe.get(token, stack.track.by_class.get(int(classes[token])))
        assert suffix is not None and 1 + len(suffix) + 1 <= stack.left  # and end-of-sequence
        assert closing_module.completes(stack.inner, [token, *suffix])
    _, again, checked = _no_slack_text_row(vocab, compiled, monkeypatch, remembered=(hello,))
    assert hello in checked and again == row


def test_requests_share_a_wide_rows_class_spans(vocab, monkeypatch):
    """A wide row's tokens grouped by class depend on the row alone, not on the request:
    two requests at the same free-string row (a batch's plain string fields) group it
    once (``class_spans``: no pass over the vocabulary's class order for the second), and
    the rows come out as a fresh grouping writes them."""
    from constrained.grammars import token_shapes

    vocab._built.pop("closing_class_spans", None)
    passes = []
    order = token_shapes.class_order
    token_shapes.class_order = lambda *args: passes.append(args) or order(*args)
    try:
        _, first, checked = _no_slack_text_row(vocab, grammar(vocab, NOTE), monkeypatch)
        grouped = len(passes)
        _, second, again = _no_slack_text_row(vocab, grammar(vocab, NOTE), monkeypatch)
    finally:
        token_shapes.class_order = order
    assert grouped >= 1 and len(passes) == grouped  # the second request: none of its own
    assert second == first and again == checked
    vocab._built.pop("closing_class_spans", None)
    _, fresh, _ = _no_slack_text_row(vocab, grammar(vocab, NOTE), monkeypatch)
    assert fresh == first


def test_class_spans_keep_the_rows_a_batch_comes_back_to(vocab, monkeypatch):
    """The vocabulary keeps the class spans of its last ``CLASS_SPAN_ROWS`` rows, the least
    recently used going first: a row the batch keeps coming back to (its plain string
    fields) is grouped once, however many other rows pass between (all were grouped again
    each time ``CLASS_SPAN_ROWS`` rows had been: a fifth of the grouping's misses in a
    batch of 55 MaskBench schemas)."""
    from constrained.grammars import token_shapes

    monkeypatch.setitem(vocab._built, "closing_class_spans", {})
    passes = []
    order = token_shapes.class_order
    monkeypatch.setattr(token_shapes, "class_order", lambda *a: passes.append(a) or order(*a))

    def row(seed: int) -> tuple[np.ndarray, np.ndarray]:
        keep = np.random.default_rng(seed).random(vocab.width) < 0.5
        bits = np.zeros(32 * words_for(vocab.width), dtype=bool)
        bits[: vocab.width] = keep
        return np.packbits(bits, bitorder="little").view(np.uint32), keep

    hot = row(0)
    first = token_shapes.class_spans(vocab, *hot, True)
    others = 3 * token_shapes.CLASS_SPAN_ROWS
    for seed in range(1, others + 1):
        token_shapes.class_spans(vocab, *row(seed), True)
        ordered, spans = token_shapes.class_spans(vocab, *hot, True)
        assert spans == first[1] and np.array_equal(ordered, first[0])
    assert len(passes) == 1 + others  # the hot row once, each other row once
    assert len(vocab._built["closing_class_spans"]) == token_shapes.CLASS_SPAN_ROWS


def test_a_text_row_again_keeps_tokens_that_go_on_with_the_witness(vocab, monkeypatch):
    """Inside an array of strings that needs a second item, near the budget: a free-text
    class kept on the witness (``","`` ``"]``) is not cleared when the room falls below it
    where its members go on, after their text, with the witness's first token (``a","``,
    ``","+``: the witness's rest, ``"]``, completes after them). Sorting the same row again
    keeps what a sort from scratch keeps, row for row (a review's counterexample to
    clearing every class without a lead or remembered member)."""
    from constrained.grammars.closing_matcher import closing_layer
    from constrained.grammars.closing_sorts import forget_shared_sorts

    compiled = grammar(vocab, {"type": "array", "items": {"type": "string"}, "minItems": 2})
    text = ids(vocab, b"a")[0]

    ruled: list[bool] = []  # what ``_may_fit_again`` said of each class sorted again
    may_fit = RowSorter._may_fit_again

    def rows(again: bool) -> list[list[int]]:
        forget_shared_sorts()
        if again:
            monkeypatch.setattr(
                RowSorter, "_may_fit_again", lambda *a: ruled.append(may_fit(*a)) or ruled[-1]
            )
        else:
            monkeypatch.setattr(RowSorter, "sorted_again", lambda self, *a: None)
        stack = closing_layer(compiled, vocab, 12, json=True)
        assert stack.consume(vocab.hf_tokenizer.encode('["', add_special_tokens=False))
        bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
        seen = []
        while True:
            stack.fill(bitmask, 0)
            seen.append(np.flatnonzero(closing_module.allowed_ids(bitmask[0], WIDTH)).tolist())
            if text not in seen[-1]:
                break
            assert stack.consume([text])
        monkeypatch.undo()
        return seen

    again, fresh = rows(True), rows(False)
    assert again == fresh
    assert True in ruled and False in ruled  # classes were sorted again, and cleared whole
    pieces = vocab.token_bytes()
    assert any(pieces[t] in (b' ","', b'","+') for t in again[-1])  # (not the lead alone)


def test_a_text_spelt_again_is_not_tokenized_again(vocab, monkeypatch):
    """Closing respells the same few texts over and over (a witness's rest after each token
    that writes its first bytes): ``Vocab.encode`` keeps the last few thousand, so the
    tokenizer sees each once; every call still gets a list of its own."""
    vocab.encode("warm")  # the tokenizer's Rust core, resolved once
    core = vocab._built["encode_core"]
    assert core is not False  # Qwen's fast tokenizer
    calls = []

    class Counted:
        truncation = padding = None  # as the core's: none set

        def encode(self, text, add_special_tokens):
            calls.append(text)
            return core.encode(text, add_special_tokens=add_special_tokens)

    monkeypatch.setitem(vocab._built, "encode_core", Counted())
    monkeypatch.setitem(vocab._built, "encoded", {})
    text = '","b":0}'
    first = vocab.encode(text)
    first.append(-1)  # a caller's list is its own
    assert vocab.encode(text) == vocab.hf_tokenizer.encode(text, add_special_tokens=False)
    assert calls == [text]


def test_a_tokenizer_left_truncating_still_spells_in_full(vocab):
    """A frontend sharing the tokenizer may leave truncation set on its Rust core (a
    ``transformers`` call with ``truncation=True`` does): closing's texts are spelt in full
    all the same, and such a spelling is never the one kept."""
    vocab.encode("warm")
    core = vocab._built["encode_core"]
    text = "a text of several tokens, longer than two"
    vocab._built["encoded"].pop(text, None)
    core.enable_truncation(max_length=2)
    try:
        spelt = vocab.encode(text)
    finally:
        core.no_truncation()
    assert len(spelt) > 2 and spelt == vocab.hf_tokenizer.encode(text, add_special_tokens=False)
    assert vocab.encode(text) == spelt


def _text_row_again(vocab, monkeypatch, resort: bool = True):
    """A stack inside ``NOTE``'s free string sorts its row with no slack, takes a plain
    token (the same state: the same row and witness), then writes the row again with one
    token less room, taking the first sort again (``resort``) or sorting afresh. What it
    saw: the stack, the row, the classes the first sort kept whose suffix no longer fits
    and those that still fit, the classes sorted the second time, whether that sorted the
    row whole."""
    from types import SimpleNamespace

    stack = _inside_a_note(vocab, grammar(vocab, NOTE))
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    stack.fill(bitmask, 0)  # no slack: the witness's rest takes all the room
    room = stack.left - 2 - 1  # after the plain token below
    seen = SimpleNamespace(
        stack=stack,
        too_long={key for key, suffix in stack.track.by_class.items() if len(suffix) > room},
        fits={key for key, suffix in stack.track.by_class.items() if len(suffix) <= room},
        classes=set(),
        whole=False,
    )
    assert stack.consume(ids(vocab, b"y"))
    sort_class, sort_tokens = RowSorter.sort_class, RowSorter.sort_tokens

    def counted(self, wide, span, *args):
        seen.classes.add(span[2])
        return sort_class(self, wide, span, *args)

    monkeypatch.setattr(RowSorter, "sort_class", counted)
    monkeypatch.setattr(
        RowSorter,
        "sort_tokens",
        lambda self, *a: setattr(seen, "whole", True) or sort_tokens(self, *a),
    )
    if not resort:
        monkeypatch.setattr(RowSorter, "sorted_again", lambda self, *a: None)
    stack.fill(bitmask, 0)
    monkeypatch.undo()
    seen.row = np.flatnonzero(closing_module.allowed_ids(bitmask[0], WIDTH)).tolist()
    return seen


def test_a_free_text_row_again_sorts_only_the_classes_that_no_longer_fit(vocab, monkeypatch):
    """Inside a free string, the same row with the same witness and less room (a plain
    token taken between): the classes whose suffix still fits keep it unchecked, and only
    those whose suffix is now too long are sorted again (``_sorted_again``; a UTF-8 lead
    byte's class owes a continuation byte before the witness). The row is the one a sort
    from scratch writes, and each of its tokens completes in time."""
    again = _text_row_again(vocab, monkeypatch)
    assert again.too_long and again.fits  # (the lead bytes' classes; the plain ones)
    # Only the too-long classes where a shorter suffix may fit are sorted again
    # (``_may_fit_again``: a lead, a half-written character...): the rest cleared whole.
    assert not again.whole and again.classes and again.classes < again.too_long
    stack, classes = again.stack, text_classes(vocab)[0]
    for token in again.row:
        suffix = stack.track.safe.get(token, stack.track.by_class.get(int(classes[token])))
        assert suffix is not None and 1 + len(suffix) + 1 <= stack.left
        assert closing_module.completes(stack.inner, [token, *suffix])
    fresh = _text_row_again(vocab, monkeypatch, resort=False)
    assert fresh.whole and again.fits <= fresh.classes
    assert again.row == fresh.row and stack.witness[0] in again.row


def _weather_stack(vocab, limit: int = 120):
    """A hermes tool call's stack on xgrammar, whose stacks read bytes."""
    from constrained.options import Options
    from tests.closing_walk import closing_stack
    from tests.test_structural_tag import vllm_tag

    weather = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    tag = Options(structural_tag=vllm_tag("hermes", "required", weather)).structural_tag
    return closing_stack(
        compile_now(GrammarSpec("structural_tag", tag, "xgrammar"), vocab), vocab, limit
    )


def _key_row(stack, vocab) -> tuple[list[int], np.ndarray, list[int]]:
    """After ``<tool_call>`` ``{``: the witness, the row's words, and the row's tokens that
    write the witness's first bytes (``"name``, ``"``)."""
    root = find_witness(stack.inner, vocab, 70)
    assert stack.consume(root[:2])  # ``<tool_call>`` ``{``
    witness = find_witness(stack.inner, vocab, 70)
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    stack.inner.fill(bitmask, 0)
    words = bitmask[0].numpy().view(np.uint32)
    pieces = vocab.token_bytes()
    text = b"".join(pieces[t] for t in witness)
    row = [t for t in np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
           if t < vocab.width and t != vocab.eos_token_id]  # fmt: skip
    return witness, words, [t for t in row if pieces[t] and text.startswith(pieces[t])]


def test_a_riser_rows_tokens_that_write_the_witness_text_are_kept_unchecked(vocab, monkeypatch):
    """A narrow row within reach (a key's tokens: ``"name``, ``"``) whose tokens
    write the witness's first bytes: their suffixes, the rest of the witness's text, are
    recorded without a check (no ``completes``: a matcher reads bytes, so the witness's text
    completes however tokens split it), and each of them does complete."""
    stack = _weather_stack(vocab)
    witness, words, writers = _key_row(stack, vocab)
    assert witness[0] in writers and len(writers) >= 2  # ``"name`` and ``"``
    calls = []
    counted = closing_check.completes
    monkeypatch.setattr(
        closing_check, "completes", lambda m, tokens: calls.append(tokens[0]) or counted(m, tokens)
    )
    safe = stack.risers.clear(words, witness, stack.left)
    assert safe is not None and set(writers) <= set(safe)
    assert not set(writers) & set(calls)  # none of them was checked
    monkeypatch.setattr(closing_check, "completes", counted)
    for token in writers:
        assert closing_module.completes(stack.inner, [token, *safe[token]])
    # a writer whose rest takes the whole room and one more is checked as any other token
    other = next(t for t in writers if t != witness[0])
    tight = len(safe[other]) + 1  # ``left - 2`` one short of the rest
    calls.clear()
    monkeypatch.setattr(
        closing_check, "completes", lambda m, tokens: calls.append(tokens[0]) or counted(m, tokens)
    )
    stack.risers.clear(words.copy(), witness, tight)
    assert other in calls


def test_the_witness_text_known_after_a_token_never_passes_a_token_without_bytes(vocab):
    """``Spelling.aligned_bytes``: the witness's rest after a token that writes its first
    bytes, and where it is known it completes; never across a token that writes no bytes
    (``<tool_call>``, ``</tool_call>``: no text stands for a special token), nor where the
    token does not begin the witness's text."""
    from constrained.grammars.closing_spelling import Spelling

    stack = _weather_stack(vocab)
    spelling, pieces = Spelling(vocab), vocab.token_bytes()
    root = find_witness(stack.inner, vocab, 70)
    assert pieces[root[0]] == b"" and pieces[root[-1]] == b""  # the tag's special tokens
    after_start = pieces[root[1]]
    assert spelling.aligned_bytes(after_start, root) is None  # it would pass ``<tool_call>``
    assert spelling.aligned_bytes(b"x", root) is None
    known = 0
    for k in range(1, len(root)):  # from each state along the root witness
        assert stack.consume(root[k - 1 : k])
        witness = root[k:]
        text = b"".join(pieces[t] for t in witness)
        for token, piece in enumerate(pieces):
            if not piece or not text.startswith(piece):
                continue
            rest = spelling.aligned_bytes(piece, witness)
            if rest is None:  # only where its bytes up to the next bound do not decode alone
                _, bounds = spelling.text_of(witness)
                end = next(bound for bound in bounds if bound >= len(piece))
                with pytest.raises(UnicodeDecodeError):
                    text[len(piece) : end].decode()
                continue
            assert rest[-1] == witness[-1]  # ``</tool_call>`` kept
            assert b"".join(pieces[t] for t in [token, *rest]) == text
            assert closing_module.completes(stack.inner, [token, *rest])
            known += 1
    assert known >= 10


def test_the_witness_first_token_is_checked_without_a_completes(vocab, monkeypatch):
    """A near row's check of the witness's own first token: its suffix is the witness's
    rest (the witness completes from here: checked when found, followed since), recorded
    without consuming it all again."""
    stack = _weather_stack(vocab)
    witness = find_witness(stack.inner, vocab, 70)
    calls = []
    counted = closing_check.completes
    monkeypatch.setattr(
        closing_check, "completes", lambda m, tokens: calls.append(tokens) or counted(m, tokens)
    )
    safe: dict[int, list[int]] = {}
    found = stack.checker.check(witness[0], witness, stack.left, safe, Walks())
    assert found == witness[1:] and safe == {witness[0]: witness[1:]} and not calls
    # with no room for the witness's rest the check goes on as before (here: nothing fits)
    assert stack.checker.check(witness[0], witness, len(witness), {}, Walks()) is None


def test_riser_rows_are_checked_where_the_stack_does_not_read_bytes(vocab, monkeypatch):
    """``Matcher.reads_bytes``: xgrammar's stack reads bytes (the layers above forward the
    bottom's answer); llguidance's does not (it holds forced text to its own spelling: only
    ``{"`` starts ``{"name"``, not ``{``). Where the stack does not, a riser row's tokens
    that write the witness's first bytes are checked as any other token."""
    from tests.closing_walk import closing_stack

    stack = _weather_stack(vocab)
    assert stack.inner.reads_bytes and stack.inner.bottom.reads_bytes
    lark = 'start: "{\\"name\\":\\"" word "\\"}"\nword: "abcdefgh"\n'
    plain = compile_now(GrammarSpec("grammar", lark, "llguidance"), vocab)
    assert not closing_stack(plain, vocab, 80).inner.reads_bytes
    witness, words, writers = _key_row(stack, vocab)
    writers = [t for t in writers if t != witness[0]]
    assert writers  # ``"`` against ``"name``
    monkeypatch.setattr(type(stack.inner), "reads_bytes", property(lambda self: False))
    calls = []
    counted = closing_check.completes
    monkeypatch.setattr(
        closing_check, "completes", lambda m, tokens: calls.append(tokens[0]) or counted(m, tokens)
    )
    stack.risers.clear(words, witness, stack.left)
    assert set(writers) <= set(calls)


def server_weather_tag() -> str:
    """A hermes ``required`` call of one weather tool as the server passes it on: the call
    on its special token, the arguments strict (``openai_routing``)."""
    from constrained.openai_routing import call_on_its_token, strict_arguments
    from tests.test_structural_tag import vllm_tag

    weather = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    return strict_arguments(call_on_its_token(vllm_tag("hermes", "required", weather)))


def _server_tag_stack(vocab, limit: int = 120):
    """``server_weather_tag``'s stack on the default backend."""
    from tests.closing_walk import closing_stack

    compiled = compile_now(GrammarSpec("structural_tag", server_weather_tag()), vocab)
    return closing_stack(compiled, vocab, limit)


def test_a_special_token_of_the_witness_aligns_on_its_text(vocab, monkeypatch):
    """A witness that begins with ``<tool_call>`` (a special token: no bytes) still tells
    the rest after ``<`` or ``<t``, which a model may write as text: the special token's
    text after the token's bytes, then the witness after it (a suffix to check, never one
    taken unchecked). The first row's check of ``<`` finds it without a walk (two walks of
    the text a character at a time, 9 ms a request of a tool-call pass, before)."""
    from constrained.grammars.closing_spelling import Spelling, special_texts

    stack = _server_tag_stack(vocab)
    pieces = vocab.token_bytes()
    root = find_witness(stack.inner, vocab, 70)
    assert special_texts(vocab).get(root[0]) == b"<tool_call>" and pieces[root[0]] == b""
    spelling = Spelling(vocab)
    for text in (b"<", b"<t"):
        token = ids(vocab, text)[0]
        rest = spelling.aligned(token, root)
        assert rest is not None and rest[-(len(root) - 1) :] == root[1:]
        assert text + b"".join(pieces[t] for t in rest[: len(rest) - len(root) + 1]) == (
            b"<tool_call>"
        )
    assert spelling.aligned_bytes(b"<", root) is None  # unchecked: never across it
    walked = []
    real = closing_check.find_witness
    monkeypatch.setattr(
        closing_check, "find_witness", lambda *a, **k: walked.append(1) or real(*a, **k)
    )
    safe: dict[int, list[int]] = {}
    lt = ids(vocab, b"<")[0]
    found = stack.checker.check(lt, root, stack.left, safe, Walks(why=True))
    assert found is not None and closing_module.completes(stack.inner, [lt, *found])
    assert walked == []


def test_a_riser_row_like_the_last_one_reuses_its_checks(vocab, monkeypatch):
    """A number's digits one row after another: the row allows the same tokens with the
    same witness, so the request's last riser row's suffixes serve, each checked again with
    one ``completes`` (no full check, no walk), and the row ends as a fresh sort leaves it;
    a row unlike it is checked afresh."""
    stack = _server_tag_stack(vocab, limit=160)
    root = find_witness(stack.inner, vocab, 70)
    pieces = vocab.token_bytes()
    digit = next(k for k, t in enumerate(root) if pieces[t][:1].isdigit())
    assert stack.consume(root[: digit + 1])  # up to the first digit of ``days``
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)

    def row() -> tuple[np.ndarray, list[int]]:
        bitmask.zero_()
        stack.inner.fill(bitmask, 0)
        witness = stack.track.known() or stack.checker.walk(stack.left - 1)
        stack.track.commit(witness)
        return bitmask[0].numpy().view(np.uint32).copy(), witness

    words, witness = row()
    room = stack.left - 2
    assert len(witness) + stack.horizon.grow <= room  # a riser row, not a near one
    first = stack.risers.narrow(words, witness, stack.left, True)
    assert first and stack.risers.last is not None
    two = ids(vocab, b"2")[0]
    assert two in first
    assert stack.consume([two])
    words_again, witness_again = row()
    assert witness_again == witness and np.array_equal(words_again, stack.risers.last.before)
    checks = []
    real = Checker.check
    monkeypatch.setattr(
        Checker, "check", lambda self, *a, **k: checks.append(1) or real(self, *a, **k)
    )
    fresh = words_again.copy()
    again = stack.risers.narrow(words_again, witness_again, stack.left, True)
    assert checks == [] and again == first
    monkeypatch.setattr(Checker, "check", real)
    assert stack.risers.clear(fresh, witness_again, stack.left) is not None
    assert np.array_equal(fresh, words_again)  # as a fresh sort leaves it
    for token, suffix in again.items():
        assert closing_module.completes(stack.inner, [token, *suffix])
    other, _ = row()
    other[0] ^= np.uint32(1 << 5)  # another row: checked afresh
    assert stack.risers.again(other, witness, stack.left) is None
    # a suffix that no longer fits the room: checked afresh
    longest = max(len(suffix) for suffix in again.values())
    tight = longest + 1  # ``left - 2`` one short of it
    assert stack.risers.again(row()[0], witness, tight) is None
    stack.rollback(1)  # a committed token undone: the last riser row is another state's
    assert stack.risers.last is None
