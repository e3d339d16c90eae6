"""A row whose compile is still running takes admission's first row instead of holding the
batch (``grammars/start_row.py``: ``start_row``, ``keep_start_row``, ``kept_start_row``,
``StartRow``, ``replay_start``): that row is the stack's own first row, and a stack built
late stands where one built in time stands, row for row."""

from __future__ import annotations

import json
import random
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from constrained.grammars import compile_now
from constrained.grammars.closing_tables import root_witness
from constrained.grammars.matcher import row_ids, words_for
from constrained.grammars.stack import COMPILE_WAITS, build_stack
from constrained.grammars.start_row import (
    START_ROW_MAX,
    keep_start_row,
    kept_start_row,
    start_row,
)
from constrained.grammars.store import GrammarStore
from constrained.processors.mask_fill import MaskWriter, RowState
from tests.test_grammar_bookkeeping import GRAMMAR_CONSTRAINTS, TOOL_CALL, kind_of, spec_for, vocab

__all__ = ["vocab"]  # the module fixture shared with the bookkeeping test

# Two tools, as a ``required`` tool choice offers them (vLLM's hermes tag, both formats).
TOOLS = [
    ("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"], "additionalProperties": False}),
    ("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"], "additionalProperties": False}),
]  # fmt: skip
REQUIRED_PAIR = json.dumps({"type": "structural_tag", "format": {
    "type": "tags_with_separator", "separator": "", "at_least_one": True, "tags": [
        {"type": "tag", "begin": begin.format(name), "end": end,
         "content": {"type": "json_schema", "json_schema": schema}}
        for name, schema in TOOLS
        for begin, end in (('<tool_call>\n{{"name": "{}", "arguments": ', "}\n</tool_call>"),
                           ('<tool_call>{{"name": "{}", "arguments": ', "}</tool_call>"))
    ]}})  # fmt: skip
CASES = [*GRAMMAR_CONSTRAINTS, {"structural_tag": REQUIRED_PAIR}]


def first_row_of_stack(grammar, vocab, limit, kind) -> list[int]:
    """The first row a request's stack, built with its compile done, writes."""
    done: Future = Future()
    done.set_result(grammar)
    matcher = build_stack(done, vocab, limit, kind=kind).matcher
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    matcher.fill(bitmask, 0)
    return row_ids(bitmask[0].numpy().view(np.uint32)).tolist()


@pytest.mark.parametrize("extra", CASES, ids=lambda e: kind_of(e) + ":" + str(len(str(e))))
def test_the_start_row_is_the_stacks_own_first_row(extra, vocab):
    """For every budget, no closing included: the start row is the stack's first row
    exactly, or ``None`` where closing finds that row near the budget (sorted: another
    request's sort could shape it) or it allows more than ``START_ROW_MAX`` tokens."""
    spec, kind = spec_for(extra), kind_of(extra)
    grammar = compile_now(spec, vocab)
    need = len(root_witness(grammar, vocab))
    kept = 0
    for limit in (None, need + 1, need + 2, need + 9, 2 * need + 10, 4 * need + 120, 4096):
        found = start_row(compile_now(spec, vocab), vocab, limit, kind)
        own = first_row_of_stack(compile_now(spec, vocab), vocab, limit, kind)
        if found is None:
            near = limit is not None and limit - 2 < need + max(8, need)
            assert near or len(own) > START_ROW_MAX, (limit, need, len(own))
            continue
        kept += 1
        assert found == own, limit
    assert kept or len(first_row_of_stack(grammar, vocab, None, kind)) > START_ROW_MAX


def test_a_tool_pairs_start_row_is_kept_at_max_tokens_160(vocab):
    """The shape of ``benchmarks.tool_calls_cold``'s ``required`` requests: a row that would
    wait is given one."""
    grammar = compile_now(spec_for({"structural_tag": REQUIRED_PAIR}), vocab)
    ids = start_row(grammar, vocab, 160, "structural_tag")
    assert ids and ids == first_row_of_stack(grammar, vocab, 160, "structural_tag")


def test_the_store_carries_it_and_refuses_what_is_not_a_row(tmp_path, vocab):
    """Admission keeps the row beside the grammar (``stored_as``); the engine reads it by the
    spec's key; an entry that is not a list of at most ``START_ROW_MAX`` ids within the
    vocabulary is no row; a grammar without a store keeps nothing."""
    spec = spec_for({"structural_tag": TOOL_CALL})
    store = GrammarStore(tmp_path / "store", max_bytes=1 << 24)
    grammar = compile_now(spec, vocab)
    grammar.stored_as = (store, "k" * 64)
    compiler = SimpleNamespace(store=store, key_of=lambda s: "k" * 64, vocab=vocab)
    assert kept_start_row(compiler, spec, 64) is None  # nothing kept yet
    keep_start_row(grammar, vocab, 64, "structural_tag")
    assert kept_start_row(compiler, spec, 64) == start_row(grammar, vocab, 64, "structural_tag")
    assert kept_start_row(compiler, spec, 65) is None  # kept per budget
    keep_start_row(grammar, vocab, 3, "structural_tag")  # near the budget: kept as none
    assert kept_start_row(compiler, spec, 3) is None
    from constrained.grammars.start_row import _start_row_name
    from constrained.grammars.store import store_key

    name = store_key("k" * 64, _start_row_name(7))
    for bad in ([], [vocab.width], [1.5], list(range(START_ROW_MAX + 1)), {"a": 1}):
        store.save(name, "stack", json.dumps(bad).encode())
        assert kept_start_row(compiler, spec, 7) is None, bad
    store.save(name, "xgrammar", json.dumps([1, 2]).encode())  # not a kept row's entry
    assert kept_start_row(compiler, spec, 7) is None
    assert kept_start_row(SimpleNamespace(store=None), spec, 7) is None
    keep_start_row(compile_now(spec, vocab), vocab, 64, "structural_tag")  # no store: nothing


class Late(Future):
    """A compile still running until ``finish``: waiting for it before then is an error."""

    def __init__(self, grammar) -> None:
        super().__init__()
        self.grammar = grammar

    def result(self, timeout=None):
        assert self.done(), "a row waited for a compile the start row covers"
        return super().result(timeout)

    def finish(self) -> None:
        self.set_result(self.grammar)


@pytest.mark.parametrize("extra", [{"structural_tag": REQUIRED_PAIR}, GRAMMAR_CONSTRAINTS[3]],
                         ids=["required_pair", "json_enum"])  # fmt: skip
@pytest.mark.parametrize("limit", [None, 40, 160])
def test_a_late_compile_takes_the_start_row_and_stays_in_step(extra, limit, vocab, monkeypatch):
    """Two requests of one constraint, each with its own compiled grammar: one compiled in
    time, one whose compile finishes only after its first row, which takes the start row
    (where its first row is near the budget, none is kept and the compile is awaited).
    Fed the same sampled tokens, they write the same row at every step, to the end:
    the late stack, built at its second row, replays its first (closing's checks)."""
    from constrained.grammars import stack as stack_module

    monkeypatch.setattr(stack_module.COMPILE_WAITS, "started", 0)
    spec, kind = spec_for(extra), kind_of(extra)
    ids = start_row(compile_now(spec, vocab), vocab, limit, kind)
    done: Future = Future()
    done.set_result(compile_now(spec, vocab))
    late = Late(compile_now(spec, vocab))
    if ids is None:  # its first row is near the budget: none kept, the row waits as before
        closing = build_stack(done, vocab, limit, kind=kind).matcher
        assert limit is not None and closing.near()
        late.finish()
    in_time, started = RowState(spec, done, None, limit), RowState(spec, late, None, limit)
    started.start_row = ids
    writer = MaskWriter(vocab, torch.device("cpu"))
    writer.ensure_rows(2)
    rng = random.Random(7)
    new: list[int] = []
    for step in range(200):
        writer.start_step()
        writer.advance(in_time, list(new), 0)
        writer.advance(started, list(new), 1)
        writer.finish()
        words = writer.bitmask.numpy().view(np.uint32)
        assert np.array_equal(words[0], words[1]), step
        if step and limit is not None:  # closing's state too: its witness and its checks
            mine, theirs = started.row.matcher, in_time.row.matcher
            assert (mine.witness, mine.track.safe) == (theirs.witness, theirs.track.safe), step
        if step == 0 and ids is not None:
            assert started.started and started.row is None and COMPILE_WAITS.started == 1
            late.finish()
        elif step == 0:
            assert not started.started and started.row is not None and COMPILE_WAITS.started == 0
        allowed = row_ids(words[0]).tolist()
        token = rng.choice(allowed)
        if token == vocab.eos_token_id:
            break
        new = [token]
    else:
        assert limit is None  # closing ends every output by its budget
    assert in_time.row.matcher.error is None and started.row.matcher.error is None


def test_a_compile_done_in_time_or_a_later_row_never_takes_it(vocab):
    """The start row is only the first row's, and only while the compile runs."""
    spec = spec_for({"structural_tag": TOOL_CALL})
    grammar = compile_now(spec, vocab)
    ids = start_row(grammar, vocab, 64, "structural_tag")
    done: Future = Future()
    done.set_result(grammar)
    state = RowState(spec, done, None, 64)
    state.start_row = ids
    assert state.ready_matcher(vocab, None, first=True) is state.matcher and not state.started
    running = Late(grammar)
    state = RowState(spec, running, None, 64)
    state.start_row = ids
    running.finish()  # done by the time its row is written
    state.ready_matcher(vocab, None, first=True)
    assert not state.started and state.row is not None


def _first_step(vocab, extra, limit, compiled):
    """A request's state after its first row (its writer's step), and the writer."""
    spec = spec_for(extra)
    state = RowState(spec, compiled, None, limit)
    state.start_row = start_row(compile_now(spec, vocab), vocab, limit, kind_of(extra))
    writer = MaskWriter(vocab, torch.device("cpu"))
    writer.ensure_rows(2)
    writer.start_step()
    writer.advance(state, [], 0)
    writer.draft(state, 1, np.array([-1, -1]))  # a step inside the prefill: placeholders
    writer.finish()
    return state, writer


@pytest.mark.parametrize("limit", [None, 160])
def test_draft_rows_and_a_preemption_at_the_start_row_are_as_in_time(limit, vocab):
    """A placeholder draft row after the start row is that row, as a stack built in time
    writes it; a run preempted right after its start row hands its resumed run the
    completions a stack built in time would have known (its stack built then)."""
    from constrained.processors.mask_fill import ResumeShelf

    extra = {"structural_tag": REQUIRED_PAIR}
    done: Future = Future()
    done.set_result(compile_now(spec_for(extra), vocab))
    late = Late(compile_now(spec_for(extra), vocab))
    in_time, writer = _first_step(vocab, extra, limit, done)
    started, late_writer = _first_step(vocab, extra, limit, late)
    assert started.started and started.row is None
    rows, late_rows = (w.bitmask.numpy().view(np.uint32) for w in (writer, late_writer))
    assert np.array_equal(rows[:2], late_rows[:2]) and np.array_equal(late_rows[0], late_rows[1])
    late.finish()
    scratch = writer.scratch
    assert ResumeShelf.hints(started, vocab, scratch) == ResumeShelf.hints(in_time, vocab, scratch)
    assert started.row is not None
