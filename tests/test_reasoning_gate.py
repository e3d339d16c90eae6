"""Think first, then answer constrained (``reasoning_end``, ``max_reasoning_tokens``).

The gate's bookkeeping alone, then ``GrammarMaskProcessor`` driven with simulated V1 batches
(joins, leaves, moves, preemption with the output so far) and random logits, as
``test_grammar_bookkeeping.py`` does: a thinking row is left as it was (only end-of-sequence
banned) or forced to the marker's next token; after the marker every row is a subset of the
grammar's; every request ends complete. The real engine: ``test_reasoning_engine.py``; vLLM's
real V2 sampler: the ``reasoning`` scenario of ``test_v2_real_sampler.py``.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from vllm import SamplingParams

from constrained.grammars import GrammarSpec, compile_now
from constrained.grammars.closing import MAX_WITNESS_TOKENS, completes
from constrained.grammars.marker import Marker, marker_for, text_pieces
from constrained.grammars.matcher import Matcher, fill_only, words_for
from constrained.grammars.reasoning_gate import (
    GatedMatcher,
    ReasoningGate,
    Thinking,
    answer_room,
    prompt_closes_thinking,
)
from constrained.grammars.stack import FailedMatcher, build_stack
from constrained.processors.grammar_mask import GrammarMaskProcessor
from tests.simulate import Request, V1Batch, fake_vllm_config
from tests.test_grammar_bookkeeping import CAPACITY, WIDTH, Reference, config, sample, vocab

__all__ = ["config", "vocab"]  # module fixtures shared with the bookkeeping test

MARKER = "</think>"
SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                     "required": ["ok"], "additionalProperties": False})  # fmt: skip


# A toy vocabulary: 0 " ", 1 "\n\n", 2 "</", 3 "think", 4 ">", 5 ">\n\n", 6 "{", 7 "so".
PIECES = [b" ", b"\n\n", b"</", b"think", b">", b">\n\n", b"{", b"so"]
TOY = Marker(b"</think>", (2, 3, 4), ((2, 3, 4), (2, 3, 4), (3, 4), (3, 4), (3, 4), (3, 4),
             (3, 4), (4,)), PIECES)  # fmt: skip


def test_gate_follows_and_forces_the_marker():
    gate = ReasoningGate(TOY, force_after=3)
    assert gate.feed([7, 2]) is None and gate.forced_token() is None
    assert gate.feed([0]) is None and gate.forced_token() == 2
    assert gate.feed([2]) is None and gate.forced_token() == 3  # continues the partial "</"
    assert gate.feed([3]) is None and gate.forced_token() == 4
    assert gate.feed([4, 6]) == [6] and gate.open
    free = ReasoningGate(TOY)
    assert free.feed([7] * 100) is None and free.forced_token() is None
    assert free.feed([2, 3, 5, 6]) == [6] and free.open  # ">\n\n" completes it too


# The same vocabulary with the marker also one added token, 9 (Qwen3's ``</think>``).
ONE = Marker(b"</think>", (9,), tuple((9,) for _ in range(8)), [*PIECES, b"x", b"</think>"], 9)


def test_a_one_token_marker_is_that_token_only():
    """vLLM's reasoning parsers end thinking at the marker's id: spelled in pieces it is
    thinking text, and forcing writes the token even after a partial spelling (the bug the
    engine test found: "</" then a forced "think", ">", and the answer stayed reasoning)."""
    gate = ReasoningGate(ONE, force_after=4)
    assert gate.feed([2, 3, 4]) is None and not gate.open  # "</think>" spelled: still thinking
    assert gate.spills() == [] and gate.forced_token() is None
    assert gate.feed([2]) is None and gate.forced_token() == 9  # after "</": the token
    assert gate.feed([9, 6]) == [6] and gate.open


def test_tokens_completing_the_marker_with_more_text_are_banned_while_thinking():
    assert TOY.spills[0] == () and TOY.spills[7] == (5,)  # ">\n\n" after "</think"
    gate = ReasoningGate(TOY)
    assert gate.feed([7, 2]) is None and gate.spills() == []
    assert gate.feed([3]) is None and gate.spills() == [5]


# -- the gate as the top layer of a stack (grammars/matcher.py's contract) ----------------

EOS = 8  # the toy vocabulary's end-of-sequence (ids 0-7 above, 8 here)


class Toy(Matcher):
    """A toy answer: exactly ``target`` (``{`` then a space), then end-of-sequence."""

    def __init__(self, target: tuple[int, ...] = (6, 0)) -> None:
        self.target, self.taken = target, []

    def consume(self, tokens):
        taken = self.try_consume(tokens)
        if taken < len(tokens):
            self.error = "refused"
        return self.error is None

    def try_consume(self, tokens):
        taken = 0
        for token in tokens:
            if self.target[len(self.taken) : len(self.taken) + 1] != (token,):
                break
            self.taken.append(token)
            taken += 1
        return taken

    def rollback(self, num_tokens):
        del self.taken[len(self.taken) - num_tokens :]

    def fill(self, bitmask, row):
        rest = self.target[len(self.taken) :]
        fill_only(bitmask, row, [rest[0]] if rest else [EOS])

    def accepts_end(self):
        return len(self.taken) == len(self.target)


class ToyAnswer:
    """What ``stack.build_stack`` hands the gate: the answer's layers, built on demand."""

    def __init__(self, need: int | None = 2) -> None:
        self.built, self.needs, self.spent, self._need = 0, 0, None, need
        self.toy = Toy()

    def matcher(self):
        self.built = 1
        return self.toy

    def need(self):
        self.needs += 1
        return self._need

    def start(self, spent):
        self.spent = spent


def row_of(stack) -> set[int]:
    bitmask = torch.zeros(1, words_for(len(PIECES) + 1), dtype=torch.int32)
    stack.fill(bitmask, 0)
    words = bitmask[0].numpy().view("uint32")
    return {t for t in range(len(PIECES) + 1) if words[t // 32] >> (t % 32) & 1}


def test_gate_is_the_stacks_top_layer():
    """Thinking rows are free (no mask: every token but the bans), the layers below not even
    built; forced rows are the gate's own (it is the row's ``bottom``); after the marker the
    answer's stack takes the tokens after it and writes the rows; look-aheads roll back."""
    answer = ToyAnswer()
    stack = GatedMatcher(answer, Thinking(TOY, force_after=5, stops=(EOS, 1)))
    assert stack.reads_prompt() == len(TOY.ids) + 4
    stack.read_prompt([7, 0])  # the prompt did not close thinking
    assert stack.reads_prompt() == 0
    assert stack.consume([7, 0]) and stack.free() and stack.bans() == [EOS, 1]
    assert stack.bottom is stack and not stack.accepts_end() and stack.error is None
    assert row_of(stack) == set(range(9)) - {EOS, 1}  # what ``fill`` would write
    assert stack.stays_free()  # the next row too, very likely (2 + 1 < 5)
    assert answer.built == 0, "a thinking row built the answer's layers"
    assert stack.consume([2, 3]) and stack.free()
    assert stack.bans() == [EOS, 1, 5]  # ">\n\n" would carry text past "</think"
    # A look-ahead, then the committed token; forced from 5 tokens on.
    assert stack.try_consume([7]) == 1 and not stack.free() and stack.forced() == [2, 3, 4]
    stack.rollback(1)
    assert stack.free() and stack.gate.seen == 4 and stack.gate.tail.endswith(b"think")
    assert stack.consume([7]) and not stack.free() and not stack.stays_free()
    assert stack.forced() == [2, 3, 4] and row_of(stack) == {2} and stack.bottom is stack
    assert stack.forced_bytes() == b"</think>"
    # Drafts through the marker: the answer's stack takes what follows it, then all undone.
    before = stack.gate.state()
    assert stack.try_consume([2, 3, 4, 6, 7]) == 4  # "{" taken, "so" refused by the answer
    assert answer.built and answer.spent == 8 and answer.toy.taken == [6]
    assert not stack.free() and stack.bottom is answer.toy and row_of(stack) == {0}
    stack.rollback(4)
    assert stack.gate.state() == before and answer.toy.taken == [] and not stack.gate.open
    assert stack.forced() == [2, 3, 4]
    # Committed: open; the answer's rows, then end-of-sequence once complete.
    assert stack.consume([2, 3, 4, 6]) and stack.gate.open and answer.spent == 8
    assert not stack.free() and stack.bans() == [] and row_of(stack) == {0}
    assert stack.consume([0]) and stack.accepts_end() and row_of(stack) == {EOS}
    stack.rollback(3)  # committed tokens too, across the marker
    assert not stack.gate.open and answer.toy.taken == [] and stack.forced() == [4]


def test_gate_places_the_forced_marker_for_the_budget_on_committed_rows():
    """Near ``max_tokens`` a committed thinking row walks once for the answer's need and
    forces the marker early enough to leave the answer its room; look-aheads never walk."""
    marker_room = len(TOY.ids)
    limit = marker_room + answer_room(MAX_WITNESS_TOKENS) + 5  # the walk 5 tokens in
    answer = ToyAnswer(need=2)
    stack = GatedMatcher(answer, Thinking(TOY, None, (EOS,)), limit)
    stack.read_prompt([])
    assert stack.consume([7] * 4) and stack.free() and answer.needs == 0
    assert stack.stays_free() is False  # one more token reaches the walk: the fill thread
    assert stack.try_consume([7]) == 1 and stack.free() and answer.needs == 0
    stack.rollback(1)
    assert stack.consume([7]) and answer.needs == 0  # counted when its row is asked for
    latest = limit - marker_room - answer_room(2)
    assert stack.gate.seen < latest and stack.free() and answer.needs == 1
    assert stack.gate.force_after == latest
    stack.consume([0] * (latest - stack.gate.seen))
    assert not stack.free() and stack.forced() == [2, 3, 4] and answer.needs == 1


def test_gate_reads_the_prompt_that_closed_thinking():
    answer = ToyAnswer()
    stack = GatedMatcher(answer, Thinking(TOY, 0, (EOS,)))
    stack.read_prompt([7, 2, 3, 5, 0])
    assert stack.gate.open and answer.spent == 0 and not stack.free()
    assert row_of(stack) == {6} and stack.reads_prompt() == 0


def test_stack_under_a_gate_waits_for_no_compile():
    """``build_stack`` with a gate returns at once: thinking rows never wait for the compile;
    a compile that fails leaves the thinking free and the answer only end-of-sequence."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    vocab = SimpleNamespace(eos_token_id=EOS)
    compiled: Future = Future()
    row = build_stack(compiled, vocab, None, thinking=Thinking(TOY, None, (EOS,)))
    stack = row.matcher
    assert isinstance(stack, GatedMatcher) and row.gate is stack  # the gate's hooks: the row's
    assert row.reads_prompt() > 0
    row.read_prompt([])
    assert row.reads_prompt() == 0
    assert stack.consume([7, 2, 3]) and row.free() and EOS in row.bans() == stack.bans()
    assert not compiled.done()
    compiled.set_exception(RuntimeError("lost"))
    assert stack.try_consume([4]) == 1 and not row.free() and stack.error == "lost"
    assert isinstance(stack.bottom, FailedMatcher) and row_of(stack) == {EOS}
    stack.rollback(1)
    assert stack.error is None and row.free()


def test_a_stack_that_waits_for_its_compile_counts_the_wait(monkeypatch):
    """A row whose compile is still running when its answer's stack is built waits for it:
    ``COMPILE_WAITS`` counts each such wait and its time (the engine's stats); a compile
    already done counts none, nor a row that thinks first (its gate waits for no compile)."""
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from constrained.grammars import stack as stack_module

    class Running:  # a compile still running: done() is False, result() takes a while
        def __init__(self, outcome: object) -> None:
            self.outcome = outcome

        def done(self) -> bool:
            return False

        def result(self) -> object:
            time.sleep(0.005)
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    waits = stack_module.CompileWaits()
    monkeypatch.setattr(stack_module, "COMPILE_WAITS", waits)
    vocab = SimpleNamespace(eos_token_id=EOS)
    done: Future = Future()
    done.set_result(SimpleNamespace(matcher=lambda: "the grammar's matcher"))
    assert build_stack(done, vocab, None).matcher == "the grammar's matcher"
    build_stack(Running(OSError()), vocab, None, thinking=Thinking(TOY, None, (EOS,)))
    assert (waits.count, waits.seconds) == (0, 0.0)
    late = build_stack(Running(SimpleNamespace(matcher=lambda: "late")), vocab, None)
    assert late.matcher == "late" and waits.count == 1 and waits.seconds > 0
    failed = build_stack(Running(OSError("lost")), vocab, None)  # waited, then only the end
    assert row_of(failed.matcher) == {EOS} and waits.count == 2


def test_a_row_without_a_gate_is_never_free_and_reads_no_prompt():
    """A request that does not think first has no gate: its row is never free, bans
    nothing and reads no prompt; its stack is the answer's."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    compiled: Future = Future()
    compiled.set_exception(RuntimeError("lost"))
    row = build_stack(compiled, SimpleNamespace(eos_token_id=EOS), None)
    assert row.gate is None and isinstance(row.matcher, FailedMatcher)
    assert not row.free() and row.bans() == [] and not row.stays_free()
    assert row.reads_prompt() == 0
    row.read_prompt([1, 2])  # nothing to read
    assert row_of(row.matcher) == {EOS}


def test_thinking_rows_cost_no_fill_and_no_apply(config, monkeypatch):
    """A batch of thinking rows: no compile awaited, no bitmask applied, no row written."""
    from concurrent.futures import Future

    from vllm.v1.sample.logits_processor import BatchUpdate

    from constrained.processors import grammar_mask

    awaited = []

    class Never(Future):  # a compile that never finishes; waiting for it is recorded
        def result(self, timeout=None):
            awaited.append(timeout)
            raise TimeoutError

    proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
    monkeypatch.setattr(proc.compiler, "submit", lambda spec: Never())
    applied = []
    monkeypatch.setattr(grammar_mask, "apply_token_bitmask", lambda *a: applied.append(a))
    extra = {"json_schema": SCHEMA, "reasoning_end": MARKER}
    params = SamplingParams(max_tokens=10_000, extra_args=extra)
    outputs: list[list[int]] = [[], []]
    added = [(i, params, [1, 2, 3], outputs[i]) for i in range(2)]
    proc.update_state(BatchUpdate(2, removed=[], added=added, moved=[]))
    proc.writer.bitmask.fill_(7)
    for step in range(3):
        out = proc.apply(torch.zeros(2, WIDTH))
        assert (out[:, proc.vocab.eos_token_id] == float("-inf")).all()
        assert int((out == float("-inf")).sum()) == 2
        for output in outputs:
            output.append(100 + step)
        proc.update_state(None)
    assert not applied and not awaited and bool((proc.writer.bitmask == 7).all())


def test_prompt_that_closed_thinking():
    assert prompt_closes_thinking([7, 2, 3, 5, 0], TOY)
    assert prompt_closes_thinking([2, 3, 4], TOY)
    assert not prompt_closes_thinking([2, 3, 4, 6], TOY)
    assert not prompt_closes_thinking([3, 4, 1], TOY)


def test_marker_from_a_real_vocabulary(vocab):
    marker = marker_for(vocab, "</think>")
    assert vocab.hf_tokenizer.decode(list(marker.ids)) == "</think>"
    assert all(vocab.hf_tokenizer.decode(list(ids)) == "</think>"[k:]
               for k, ids in enumerate(marker.rest))  # fmt: skip


def split(tokens: list[int], vocab) -> tuple[list[int], list[int]] | None:
    """(thinking, answer) around the token that completes the marker's text; None when the
    text has no marker."""
    for i in range(len(tokens)):
        if MARKER in vocab.hf_tokenizer.decode(tokens[: i + 1]):
            return tokens[:i], tokens[i + 1 :]
    return None


@pytest.mark.parametrize("seed", [0, 1])
def test_v1_thinks_then_answers_constrained(vocab, config, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
    reference = Reference(vocab)
    marker = marker_for(vocab, MARKER).ids
    assert len(marker) > 1  # the Qwen2 vocabulary spells it in pieces: partial matches count
    newline = vocab.hf_tokenizer.encode("\n\n", add_special_tokens=False)
    eos = vocab.eos_token_id
    text, pieces = MARKER.encode(), text_pieces(vocab)
    spilling = spilling_tokens(pieces)
    writes_marker = {t for ids in marker_for(vocab, MARKER).rest for t in ids}
    batch = V1Batch(CAPACITY, rng)
    next_id, finished, thinking_rows, forced_rows, closed_prompts = 0, 0, 0, 0, 0
    spill_rows = stop_rows = 0
    for step in range(150):
        new = []
        for _ in range(rng.randint(0, 2)):
            think = rng.choice([None, 0, 2, 5, 9])
            extra = {"json_schema": SCHEMA, "reasoning_end": MARKER}
            if think is not None:
                extra["max_reasoning_tokens"] = think
            closed = rng.random() < 0.2  # the template already closed the thinking block
            prompt = [rng.randrange(1000) for _ in range(3)] + (list(marker) + newline) * closed
            budget = rng.choice([10_000, 60])  # never reached, or closing by max_tokens
            # Also banned while thinking (sometimes one of the marker's tokens, which is not).
            stop = [rng.choice([rng.randrange(1000), marker[-1]])] if rng.random() < 0.3 else None
            params = SamplingParams(
                temperature=1.0, max_tokens=budget, stop_token_ids=stop, extra_args=extra
            )
            new.append(Request(next_id, params, prompt))
            next_id += 1
        proc.update_state(batch.step(new))
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), WIDTH)
        # Make the marker likely sometimes, so that models end thinking on their own too.
        likely = 14.0 * (torch.rand(len(batch.rows), 1) < 0.4)
        logits[:, list(marker)] += likely
        for i, req in enumerate(batch.rows):  # and "think" after "</": the marker nearly done
            if req.output[-1:] == [marker[0]] and rng.random() < 0.8:
                logits[i, marker[1]] += 14.0
        logits[:, spilling] += 3.0  # and tokens that would carry text past it
        out = proc.apply(logits.clone())
        for i, req in enumerate(batch.rows):
            extra = req.params.extra_args
            closed_prompt = split(req.prompt, vocab) is not None
            parts = ([], req.output) if closed_prompt else split(req.output, vocab)
            allowed = out[i] > float("-inf")
            if parts is None:  # still thinking
                cap = extra.get("max_reasoning_tokens")
                if (cap is not None and len(req.output) >= cap) or int(allowed.sum()) == 1:
                    assert int(allowed.sum()) == 1, "a forced row allows one token"
                    assert int(allowed.nonzero()[0]) in marker
                    forced_rows += 1
                else:
                    # Banned: end-of-sequence, the request's stop tokens, and the tokens that
                    # would complete the marker with text after it; nothing else is touched.
                    spills = spills_after(req.output, pieces, spilling)
                    stops = set(req.params.stop_token_ids) - writes_marker  # it stays writable
                    expected = {eos, *stops, *spills}
                    banned = set((~allowed).nonzero().flatten().tolist())
                    assert banned == expected, (banned ^ expected, req.output)
                    keep = allowed.clone()
                    assert torch.equal(out[i][keep], logits[i][keep]), "a thinking row was masked"
                    thinking_rows += 1
                    spill_rows += bool(spills)
                    stop_rows += bool(req.params.stop_token_ids)
            else:
                grammar_allows = reference.allowed({"json_schema": SCHEMA}, parts[1])
                assert not (allowed & ~grammar_allows).any(), f"step {step}: outside the grammar"
            token = sample(out[i], rng)
            req.output.append(token)
            if token == eos or len(req.output) >= req.params.max_tokens:
                req.done = True
                assert token == eos, f"cut at max_tokens: {req.output}"
                parts = ([], req.output) if closed_prompt else split(req.output, vocab)
                assert parts is not None, "ended without the marker"
                thought = b"".join(pieces[t] for t in req.output[: len(parts[0]) + 1])
                assert closed_prompt or thought.endswith(text), "text after the marker unchecked"
                matcher = compile_now(GrammarSpec("json_schema", SCHEMA), vocab).matcher()
                assert completes(matcher, parts[1][:-1]), req.output
                finished += 1
                closed_prompts += closed_prompt
    counts = (finished, thinking_rows, forced_rows, closed_prompts, spill_rows, stop_rows)
    assert finished >= 20 and thinking_rows >= 50 and forced_rows >= 10, counts
    assert closed_prompts >= 2 and spill_rows >= 5 and stop_rows >= 10, counts


def spilling_tokens(pieces: list[bytes]) -> list[int]:
    """Tokens that could complete the marker with text after it (a superset, for checks)."""
    text = MARKER.encode()
    tails = [text[k:] for k in range(1, len(text))]
    return [
        t
        for t, p in enumerate(pieces[:WIDTH])
        if text in p or any(len(p) > len(tail) and p.startswith(tail) for tail in tails)
    ]


def spills_after(output: list[int], pieces: list[bytes], spilling: list[int]) -> set[int]:
    """The tokens that, after ``output`` (no marker yet), would complete the marker with more
    text after it: a thinking row must ban exactly these, besides its stop tokens."""
    text = MARKER.encode()
    written = b"".join(pieces[t] for t in output)[-(len(text) - 1) :]
    found = set()
    for token in spilling:
        window = written + pieces[token]
        at = window.find(text)
        if at >= 0 and at + len(text) < len(window):
            found.add(token)
    return found


def test_reasoning_parser_gives_the_default_marker_and_bans_its_implicit_ends():
    """With vLLM's qwen3 reasoning parser (Qwen3.6's vocabulary: ``</think>`` and
    ``<tool_call>`` single tokens), a constrained request without ``reasoning_end`` gets
    ``</think>`` at admission; while it thinks, ``<tool_call>`` (the parser's implicit end)
    is banned with end-of-sequence; after ``</think>`` the grammar applies."""
    from types import SimpleNamespace

    from constrained.admission import prepare_request
    from constrained.grammars import load_vocab
    from constrained.reasoning_parser import thinking_ends
    from constrained.tiny_model import build_tiny_model

    model = str(build_tiny_model("qwen3.6"))
    width = 248_320
    vocab36 = load_vocab(model, width)
    tokenizer = vocab36.hf_tokenizer
    think_end, tool_call = (tokenizer.convert_tokens_to_ids(t) for t in ("</think>", "<tool_call>"))
    parser = SimpleNamespace(reasoning_parser="qwen3", enable_in_reasoning=False)
    config = fake_vllm_config(4, width, model, structured_outputs_config=parser)
    assert thinking_ends(config, tokenizer).implicit_ids == {tool_call}
    constrained = SamplingParams(max_tokens=10_000, extra_args={"json_schema": SCHEMA})
    plain = SamplingParams(max_tokens=10_000, extra_args={"min_p": 0.1})
    for params in (constrained, plain):
        prepare_request(params, config, tokenizer)
    assert constrained.extra_args["reasoning_end"] == "</think>"
    assert "reasoning_end" not in plain.extra_args  # not constrained: nothing to gate
    enabled = SimpleNamespace(**{**vars(config), "structured_outputs_config": SimpleNamespace(
        reasoning_parser="qwen3", enable_in_reasoning=True)})  # fmt: skip
    assert thinking_ends(enabled, tokenizer).marker is None  # constrained from the start

    from vllm.v1.sample.logits_processor import BatchUpdate

    proc = GrammarMaskProcessor(config, torch.device("cpu"), False)
    prompt, output = tokenizer.encode("<|im_start|>assistant\n<think>\n"), []
    joined = [(0, constrained, prompt, output)]
    proc.update_state(BatchUpdate(1, removed=[], added=joined, moved=[]))
    for token in (tokenizer.encode("hmm", add_special_tokens=False)[0], think_end):
        out = proc.apply(torch.zeros(1, width))
        banned = (out[0] == float("-inf")).nonzero().flatten().tolist()
        assert banned == sorted({vocab36.eos_token_id, tool_call}), banned
        output.append(token)
        proc.update_state(None)
    out = proc.apply(torch.zeros(1, width))
    assert int((out[0] > float("-inf")).sum()) < 1000  # the JSON grammar now
    allowed = (out[0] > float("-inf")).nonzero().flatten().tolist()
    assert tokenizer.decode(allowed[:1]).startswith("{"), [tokenizer.decode([t]) for t in allowed]
