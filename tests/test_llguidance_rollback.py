"""llguidance's matcher held to the contract's ``rollback``: after a look-ahead is undone,
no state of it survives, so every row equals a fresh matcher's at the same state.

llguidance 1.7.6 leaves state behind when a mask is computed inside a look-ahead that is then
rolled back: ``{`` then ``"b":"`` looked ahead, a mask, the look-ahead undone, then
``"a":"x``: the row leaves out the 49 tokens that close the string (``",``, ``]",``...),
which the matcher itself still consumes. Closing's walks and the draft rows do exactly this.
Found by ``benchmarks/closing_walks.py`` (needless clears on MaskBench o10617).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from constrained.grammars import GrammarSpec, compile_now, load_vocab
from constrained.grammars.checked_matcher import unwrapped
from constrained.grammars.matcher import row_ids, words_for

WIDTH = 151_936
TWO_STRINGS = {"type": "object", "additionalProperties": False,
               "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(scope="module")
def grammar(vocab):
    spec = GrammarSpec("json_schema", json.dumps(TWO_STRINGS), backend="llguidance")
    return unwrapped(compile_now(spec, vocab))  # llguidance's own grammar and matcher


def encode(vocab, text: str) -> list[int]:
    return list(vocab.hf_tokenizer.encode(text, add_special_tokens=False))


def row(matcher) -> np.ndarray:
    bitmask = torch.zeros(1, words_for(WIDTH), dtype=torch.int32)
    matcher.fill(bitmask, 0)
    return row_ids(bitmask[0].numpy().view(np.uint32))


def fresh_row(grammar, tokens: list[int]) -> np.ndarray:
    matcher = grammar.matcher()
    assert matcher.consume(tokens)
    return row(matcher)


def test_a_mask_inside_an_undone_look_ahead_leaves_no_trace(grammar, vocab):
    matcher = grammar.matcher()
    assert matcher.consume(encode(vocab, "{"))
    ahead = encode(vocab, '"b":"')
    assert matcher.try_consume(ahead) == len(ahead)
    inside = row(matcher)  # a walk's mask, or a draft row's
    assert inside.size > WIDTH // 2  # inside a free string: most of the vocabulary
    matcher.rollback(len(ahead))
    after = encode(vocab, '"a":"x')
    assert matcher.consume(after)
    expected = fresh_row(grammar, encode(vocab, "{") + after)
    closers = [t for t in expected.tolist() if vocab.token_bytes()[t].endswith(b'",')]
    assert closers  # the tokens llguidance 1.7.6 loses here
    np.testing.assert_array_equal(row(matcher), expected)


def test_each_draft_row_and_the_committed_row_equal_fresh_ones(grammar, vocab):
    """The writer's pattern: a committed row, then each draft's row after the drafts before
    it, undone; then the tokens the verifier took."""
    matcher = grammar.matcher()
    start = encode(vocab, "{")
    assert matcher.consume(start)
    row(matcher)
    drafts = encode(vocab, '"b":"yy')
    for k in range(1, len(drafts) + 1):
        assert matcher.try_consume(drafts[:k]) == k
        np.testing.assert_array_equal(row(matcher), fresh_row(grammar, start + drafts[:k]))
        matcher.rollback(k)
    taken = encode(vocab, '"a":"z')
    for token in taken:
        assert matcher.consume([token])
    np.testing.assert_array_equal(row(matcher), fresh_row(grammar, start + taken))


def test_committed_tokens_undone_below_a_mask_rebuild_the_matcher(grammar, vocab):
    matcher = grammar.matcher()
    start, gone = encode(vocab, "{"), encode(vocab, '"b":"')
    assert matcher.consume(start) and matcher.consume(gone)
    row(matcher)  # a committed row, masked in place
    matcher.rollback(len(gone))  # committed tokens undone (contract: as before them)
    after = encode(vocab, '"a":"x')
    assert matcher.consume(after)
    np.testing.assert_array_equal(row(matcher), fresh_row(grammar, start + after))
    assert matcher.error is None and not matcher.ahead


def test_tokens_consumed_on_top_of_a_look_ahead_are_undone_with_it(grammar, vocab):
    matcher = grammar.matcher()
    start = encode(vocab, "{")
    assert matcher.consume(start)
    ahead, more = encode(vocab, '"b"'), encode(vocab, ':"')
    assert matcher.try_consume(ahead) == len(ahead)
    assert matcher.consume(more)
    assert matcher.ahead == len(ahead) + len(more)
    row(matcher)  # inside the look-ahead: on a copy
    matcher.rollback(len(ahead) + len(more))
    assert matcher.ahead == 0
    after = encode(vocab, '"a":"x')
    assert matcher.consume(after)
    np.testing.assert_array_equal(row(matcher), fresh_row(grammar, start + after))


def test_a_matcher_in_error_stays_in_error_through_a_rollback(grammar, vocab):
    """A refused token ends the output (``fill`` writes end-of-sequence only); undoing
    committed tokens below a mask does not bring the grammar's row back."""
    matcher = grammar.matcher()
    assert matcher.consume(encode(vocab, '{"a":"x'))
    row(matcher)  # masked in place
    assert not matcher.consume(encode(vocab, "\n"))  # a raw newline inside a JSON string
    matcher.rollback(3)
    assert matcher.error is not None
    assert row(matcher).tolist() == [vocab.eos_token_id]
