"""Filling the grammar bitmask: the per-request matchers, and when each runner fills.

``MaskWriter`` owns the host bitmask and writes rows from matchers (any backend failure ends
that request with end-of-sequence only, never the engine). Which rows to fill, and when,
differs per runner and is decided once per processor:

- ``V1MaskFill``: V1 calls ``update_state`` before the forward pass, so the next masks are
  filled then, in a worker thread, while the model runs; rows whose newest token was still a
  GPU async-scheduling placeholder (-1) are finished in ``apply``.
- ``V2MaskFill``: V2 passes sampled and draft tokens only in ``apply``, so masks are filled
  there, after the step's one device-to-host copy.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.logger import init_logger

from constrained.grammars import GrammarSpec, Vocab
from constrained.grammars.content import ContentTracker, is_whitespace, open_row
from constrained.grammars.matcher import Matcher, fill_only, words_for
from constrained.grammars.stack import COMPILE_WAITS, GrammarRow, build_stack
from constrained.grammars.start_row import StartRow, replay_start
from constrained.helper_cpus import leave_compute_cpus
from constrained.processors.functional import apply_penalties
from constrained.processors.runners import Rows
from constrained.processors.slots import SlotTable
from constrained.processors.transfer import Uploader, fetch_to_host

if TYPE_CHECKING:
    from constrained.grammars.reasoning_gate import Thinking

logger = init_logger(__name__)


@dataclass
class RowState:
    """One constrained request: its compile, its stack and how far it has followed."""

    spec: GrammarSpec
    compiled: Future
    output_ids: list[int] | None  # V1's live output list; None under V2
    limit: int | None = None  # finishing by max_tokens (None: closing is off)
    thinking: Thinking | None = None  # its gate, if it thinks first (built with the stack)
    row: GrammarRow | None = None  # the stack and its gate (grammars/stack.py)
    hints: list[list[int]] = field(default_factory=list)  # a preempted run's completions
    content: ContentTracker | None = None  # which tokens are content (penalty scope)
    consumed: int = 0  # output tokens seen (thinking included)
    failed: bool = False
    # The first row admission's stack wrote (``start_row.kept_start_row``), written while the
    # compile still runs; ``started``: it was (the stack, once built, replays it).
    start_row: list[int] | None = None
    started: bool = False

    @property
    def matcher(self) -> Matcher | None:
        """The stack (``GrammarRow.matcher``), once built; None once a matcher failed."""
        return self.row.matcher if self.row is not None else None

    def ready_matcher(
        self, vocab: Vocab, scratch: torch.Tensor, first: bool = False
    ) -> Matcher | None:
        """The stack, built on first call (``build_stack``: it waits for the compile, unless
        the gate is on top: the layers below it are built when first needed); None once a
        matcher failed. ``first``: for the request's first row, which, while the compile
        runs, is admission's (``StartRow``) where one was kept (not for a resumed request:
        its hints are its stack's, not admission's)."""
        if self.row is None and not self.failed:
            if first and self.start_row is not None and not self.hints and not self.compiled.done():
                self.started = True
                COMPILE_WAITS.start()
                return StartRow(self.start_row)
            self.row = build_stack(
                self.compiled, vocab, self.limit, self.hints, scratch, self.thinking, self.spec.kind
            )
            if self.started:
                replay_start(self.row.matcher, vocab)
        return self.matcher

    def fail(self) -> None:
        """A matcher failed: the request is allowed only end-of-sequence from now on."""
        self.failed, self.row = True, None

    def free(self) -> bool:
        """This step's row is free (``GrammarRow.free``: a thinking row): no mask."""
        return self.row is not None and self.row.free()

    def bans(self) -> list[int]:
        return self.row.bans() if self.row is not None else []

    def reads_prompt(self) -> int:
        """Prompt tokens the stack still has to read (the gate: whether the prompt closed
        the thinking block)."""
        return self.row.reads_prompt() if self.row is not None else 0

    def read_prompt(self, tail: list[int]) -> None:
        if self.row is not None:
            self.row.read_prompt(tail)

    def stays_free(self) -> bool:
        """Its next row will likely be free and cheap (a thinking row): V1 follows a batch of
        those inline."""
        return self.row is not None and self.row.stays_free()


class ResumeShelf:
    """Each request's last row state, by its params object, so a preempted request resumes
    with the completions its stack knew (``Matcher.suffixes``: closing's).

    vLLM re-adds a preempted request (V1 and V2) with its same ``SamplingParams`` object and
    the output so far; a fresh witness walk from there may find only longer completions than
    the ones the closing rows were checked against. The hints are checked by the matcher
    before use, so a wrong match (``n > 1`` siblings share one params object) costs a check,
    never soundness. Bounded: oldest first out.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._held: dict[int, tuple[object, RowState]] = {}

    def swap(self, params: object, state: RowState) -> RowState | None:
        """Keep ``state`` for ``params``; return the state kept before for the same params
        object (a preempted run), if any."""
        held = self._held.pop(id(params), None)
        self._held[id(params)] = (params, state)
        while len(self._held) > self.size:
            del self._held[next(iter(self._held))]
        return held[1] if held is not None and held[0] is params else None

    @staticmethod
    def hints(old: RowState | None, vocab: Vocab, scratch: torch.Tensor) -> list[list[int]]:
        """The completions a preempted run's stack knew (``Matcher.suffixes``: closing's).
        A run preempted after its start row, its stack not built yet, has it built now (as
        it would have been in time: ``RowState.ready_matcher`` replays that row)."""
        if old is None:
            return []
        if old.started and old.row is None and not old.failed:
            try:
                old.ready_matcher(vocab, scratch)
            except Exception:  # (its own stack's failure: the resumed run starts afresh)
                logger.exception("constrained: a preempted run's stack failed to build")
        known = old.matcher.suffixes() if old.matcher is not None else []
        return (known + old.hints)[:512]  # bounded across repeated preemptions

    @staticmethod
    def content(old: RowState | None, json: bool) -> ContentTracker:
        """The preempted run's content tracker, which has read its output so far (the
        classes of those rows are not recomputed: a fresh tracker would call them all
        structure)."""
        if old is None or old.content is None:
            return ContentTracker(json)
        return old.content


class MaskWriter:
    """The host bitmask (one int32 row of ``ceil(width / 32)`` words per logits row).

    It drives each request's stack (``grammars/matcher.py``: consume, fill, draft look-aheads
    undone by rollback) and knows no layer by name: a free row (``free()``: a thinking row)
    gets no mask, only its ``bans()``; the other rows are written by their bottom matcher's
    ``fill_many`` (llguidance: in its thread pool; xgrammar: one batch call), then each stack's
    ``narrow``.
    """

    def __init__(self, vocab: Vocab, device: torch.device) -> None:
        self.vocab = vocab
        self.eos = vocab.eos_token_id
        self.bitmask = torch.zeros(0, words_for(vocab.width), dtype=torch.int32)
        self.scratch = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)  # witness walks
        self._uploader = Uploader(device)
        self._queued: list[tuple[Matcher, int]] = []  # rows to fill in ``finish``
        # Draft rows, written after the rows they follow (whose closing checks they reuse).
        self._drafts: list[tuple[RowState, int, list[int]]] = []
        # Free rows this step: no mask (their processors' cost is an unconstrained
        # request's); their bans as (row, token) pairs, for one indexed write.
        self.free: list[int] = []
        self.banned: tuple[list[int], list[int]] = ([], [])
        # Masked rows whose request tracks content, classified once written (drafts: the
        # draft tokens' bytes before the row).
        self._classify: list[tuple[RowState, int, list[bytes] | None]] = []
        # Structure rows whose whitespace is damped this step: (row, run, (r, f, p)).
        self.damped: list[tuple[int, int, tuple[float, float, float]]] = []
        self._whitespace_ids: torch.Tensor | None = None

    @property
    def _token_bytes(self) -> list[bytes]:
        return self.vocab.token_bytes()

    def start_step(self) -> None:
        self.free = []
        self.banned = ([], [])
        self.damped = []

    def ensure_rows(self, num_rows: int) -> None:
        if self.bitmask.shape[0] < num_rows:
            rows = max(num_rows, 2 * self.bitmask.shape[0], 8)
            self.bitmask = torch.zeros(rows, self.bitmask.shape[1], dtype=torch.int32)

    def advance(self, state: RowState, new: list[int], row: int) -> None:
        """Feed ``new`` committed tokens to a request's stack, then queue its row (or, a
        free row, take its bans)."""
        try:
            first = not new and state.consumed == 0
            matcher = state.ready_matcher(self.vocab, self.scratch, first)
            if matcher is not None:
                if new and not matcher.consume(new):
                    logger.warning("constrained: %s; allowing only end-of-sequence", matcher.error)
                state.consumed += len(new)
                self._read_content(state, new)
                if state.free():
                    self._free_row(state, row)
                    self._sampled(state, True, True)
                else:
                    self._queued.append((matcher, row))
                    if state.content is not None:
                        self._classify.append((state, row, None))
                return
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.fail()
        fill_only(self.bitmask, row, [self.eos])
        self._sampled(state, False, False)

    # ---- content classes (``grammars/content.py``): only for requests that track them ----

    def _read_content(self, state: RowState, new: list[int]) -> None:
        """The request's tracker reads the tokens that came, against the rows they were
        sampled from; the rows no token came from (rejected drafts) are dropped."""
        tracker = state.content
        if tracker is None:
            return
        done = tracker.read_count - (state.consumed - len(new))  # read by a preempted run
        data = self._token_bytes
        for token in new[max(done, 0) :]:
            tracker.read(token, data[token] if 0 <= token < len(data) else b"")
        tracker.end_step()

    @staticmethod
    def _sampled(state: RowState, open_: bool, free: bool, drafts: int = 0) -> None:
        if state.content is not None:
            state.content.row_sampled(state.consumed + drafts, open_, free)

    def _classify_rows(self) -> None:
        """Each masked row of a tracking request: open when wide enough and (JSON) inside a
        string value. The popcounts of the rows that need one are taken in one pass."""
        pending, self._classify = self._classify, []
        todo = []
        for state, row, drafts in pending:
            tracker = state.content
            in_value = tracker.in_value() if drafts is None else tracker.in_value_after(drafts)
            if in_value is False:  # between JSON tokens or in a key: structure, no count
                self._record(state, row, drafts, False)
            else:
                todo.append((state, row, drafts, in_value))
        if not todo:
            return
        words = self.bitmask.numpy().view(np.uint32)[[row for _, row, _, _ in todo]]
        allowed = np.bitwise_count(words).sum(axis=1, dtype=np.int64)
        for (state, row, drafts, in_value), count in zip(todo, allowed.tolist(), strict=True):
            self._record(state, row, drafts, open_row(count, self.vocab.width, in_value))

    def _record(self, state: RowState, row: int, drafts: list[bytes] | None, opened: bool) -> None:
        tracker = state.content
        tracker.row_sampled(state.consumed + len(drafts or ()), opened, False)
        if tracker.damping is not None and not opened:
            run = tracker.whitespace_run if drafts is None else tracker.run_after(drafts)
            if run:  # after whitespace: the next whitespace token is pushed down
                self.damped.append((row, run, tracker.damping))

    def _free_row(self, state: RowState, row: int) -> None:
        self.free.append(row)
        bans = state.bans()
        if bans:
            self.banned[0].extend([row] * len(bans))
            self.banned[1].extend(bans)

    def draft(self, state: RowState, row: int, drafts: np.ndarray) -> None:
        """A speculative row: the stack advanced over ``drafts``, its row written, undone
        (in ``finish``).

        Drafts are cut at the first negative id: vLLM feeds -1 placeholders for the draft rows
        of a step that starts inside the prefill (those rows' samples are rejected).
        """
        negative = np.flatnonzero(drafts < 0)
        tokens = drafts[: negative[0] if negative.size else len(drafts)].tolist()
        self._drafts.append((state, row, tokens))

    def _fill_after(self, state: RowState, row: int, tokens: list[int]) -> None:
        """Write the stack's row after ``tokens`` (then undo them)."""
        matcher = state.matcher
        if matcher is None and state.started and not tokens and not state.failed:
            fill_only(self.bitmask, row, state.start_row)  # (its stack is not built yet)
            return
        if matcher is None or matcher.error is not None:
            fill_only(self.bitmask, row, [self.eos])
            return
        try:
            accepted = matcher.try_consume(tokens)
            if accepted < len(tokens):  # an earlier draft is already masked: this row's
                fill_only(self.bitmask, row, [self.eos])  # sample is discarded
                self._sampled(state, False, False, len(tokens))
            elif state.free():
                self._free_row(state, row)
                self._sampled(state, True, True, len(tokens))
            else:
                matcher.fill(self.bitmask, row)
                if state.content is not None:
                    data = self._token_bytes
                    self._classify.append((state, row, [data[t] for t in tokens]))
                    self._classify_rows()
            matcher.rollback(accepted)
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.fail()
            fill_only(self.bitmask, row, [self.eos])

    def finish(self) -> None:
        """Write the queued rows: each bottom matcher type's ``fill_many`` (llguidance's
        parallel fill), then each stack's ``narrow`` (array checks, closing); then the draft
        rows, each a look-ahead from its request's row."""
        queued, self._queued = self._queued, []
        by_type: dict[type, list[tuple[Matcher, int]]] = {}
        for matcher, row in queued:
            by_type.setdefault(type(matcher.bottom), []).append((matcher.bottom, row))
        for kind, pairs in by_type.items():
            kind.fill_many(pairs, self.bitmask)
        for matcher, row in queued:
            if matcher.bottom is matcher:
                continue
            try:
                matcher.narrow(self.bitmask, row)
            except Exception:
                logger.exception("constrained: a grammar row's layer failed; ending the request")
                matcher.error = "a grammar row's layer failed"
                fill_only(self.bitmask, row, [self.eos])
        self._classify_rows()
        drafts, self._drafts = self._drafts, []
        for state, row, tokens in drafts:
            self._fill_after(state, row, tokens)

    def damp_whitespace(self, logits: torch.Tensor) -> None:
        """Whitespace at this step's damped structure rows, penalized as the request's
        penalties would penalize a token counted ``run`` times (the whitespace tokens just
        read): a run the grammar allows but nothing needs costs more with every token."""
        if self._whitespace_ids is None:
            ids = [t for t, data in enumerate(self._token_bytes) if is_whitespace(data)]
            self._whitespace_ids = torch.tensor(ids, dtype=torch.int64, device=logits.device)
        damped, self.damped = self.damped, []
        ids = self._whitespace_ids.unsqueeze(0)
        host = torch.tensor([[row, run] for row, run, _ in damped], dtype=torch.int64)
        rows, runs = host.to(logits.device, non_blocking=True).unbind(1)
        strength = torch.tensor([d for _, _, d in damped], dtype=torch.float32)
        rep, freq, pres = strength.to(logits.device, non_blocking=True).unbind(1)
        index = (rows.unsqueeze(1), ids)
        values = logits[index]
        counts = runs.unsqueeze(1).expand_as(values)
        apply_penalties(values, counts, torch.zeros_like(counts), rep, freq, pres)
        logits[index] = values

    def on_device(self, num_rows: int) -> torch.Tensor:
        """The first ``num_rows`` rows on the logits' device (non-blocking upload)."""
        return self._uploader.upload({"bitmask": self.bitmask}, rows=num_rows)["bitmask"][:num_rows]


class FillThread:
    """One worker thread that runs one call at a time while the caller goes on.

    Two ``queue.SimpleQueue``s, one each way: a round trip costs about half a
    ``ThreadPoolExecutor``'s ``submit`` plus ``Future.result`` (14 against 30 us on the
    2-core development machine, an empty call), which is most of a one-row step's fill.
    The thread ends when its owner is collected.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._ends: queue.SimpleQueue = queue.SimpleQueue()
        self._running = False
        threading.Thread(
            target=_serve, args=(self._calls, self._ends), name=name, daemon=True
        ).start()
        # The thread ends with its owner (the finalizer holds the queue, not ``self``); not
        # at the interpreter's exit, where a daemon thread woken then is torn down.
        weakref.finalize(self, self._calls.put, None).atexit = False

    def start(self, call: Callable[..., None], *args: Any) -> None:
        """Run ``call(*args)`` in the thread; one call at a time (``wait`` first)."""
        if self._running:
            raise RuntimeError("constrained: a fill is already running")
        self._running = True
        self._calls.put((call, args))

    def wait(self) -> None:
        """Wait for the running call, if any, and raise what it raised."""
        if not self._running:
            return
        error = self._ends.get()
        self._running = False  # (after the get: an interrupted wait still owes it)
        if error is not None:
            raise error


def _serve(calls: queue.SimpleQueue, ends: queue.SimpleQueue) -> None:
    leave_compute_cpus()
    while (item := calls.get()) is not None:
        call, args = item
        try:
            call(*args)
        except BaseException as error:  # handed to the waiting caller
            ends.put(error)
        else:
            ends.put(None)
        finally:  # hold nothing while idle: a bound method would keep its owner alive
            del item, call, args


INLINE_FILL_S = 200e-6  # on CPU, a fill whose last step took less time runs inline


class V1MaskFill:
    """V1: fill the next masks in a worker thread while the model runs.

    On a CPU device a small fill (the last step's took under ``INLINE_FILL_S`` of wall
    time, not CPU time: llguidance fills rows in its own threads) runs inline instead: the
    forward pass holds the same cores, so the thread gains little there, and its round trip
    (waking a thread, then the caller on another core's cold cache) cost more than such a
    fill (one 3-field row: 0.49 against 0.22 ms a step, vLLM's own path 0.33 and 0.19 ms
    beside each). On a GPU the fill always goes to the thread, hidden behind the forward
    pass.
    """

    def __init__(self, writer: MaskWriter, slots: SlotTable, layout: Any) -> None:
        self.writer = writer
        self.slots = slots
        self.filler = FillThread("constrained-mask")
        self._filled: list[int] = []
        self._num_rows = 0
        self._inline_below = INLINE_FILL_S if layout.device.type == "cpu" else 0.0
        self._last_fill_s = float("inf")  # how long the last fill took (none yet: threaded)

    def before_update(self) -> None:
        """Let the fill of the last step finish before the batch changes under it."""
        self.filler.wait()

    def after_update(self, batch_update: Any) -> None:
        """Start filling the rows of the step about to run."""
        if batch_update is not None:
            self._num_rows = batch_update.batch_size
        rows = self._ours(self._num_rows)
        self._filled = []
        self.writer.start_step()
        if rows:
            self.writer.ensure_rows(max(rows) + 1)
            if self._last_fill_s < self._inline_below or all(
                self.slots.payload[row].stays_free() for row in rows
            ):
                self._fill(rows)  # cheaper than a thread's round trip
            else:
                self.filler.start(self._fill, rows)

    def _ours(self, num_rows: int) -> list[int]:
        if not self.slots.num_active:
            return []
        return np.flatnonzero(self.slots.active[:num_rows]).tolist()

    def _fill(self, rows: list[int]) -> None:
        """Consume each row's new output tokens and write its mask (in the fill thread, or
        inline)."""
        began = time.perf_counter()
        done = []
        for row in rows:
            state: RowState = self.slots.payload[row]
            new = state.output_ids[state.consumed :]  # type: ignore[index]
            if -1 in new:  # async scheduling: the token arrives just before apply
                continue
            self.writer.advance(state, new, row)
            done.append(row)
        self.writer.finish()
        self._filled = done
        self._last_fill_s = time.perf_counter() - began

    def rows_to_mask(self, rows: Rows, logits: torch.Tensor) -> list[int]:
        """Finish the fill (rows whose token was a placeholder at update time) and return
        the rows to mask."""
        self.before_update()
        ours = self._ours(rows.count)
        missing = sorted(set(ours) - set(self._filled))
        if missing:
            self.writer.ensure_rows(rows.count)
            for row in missing:
                state: RowState = self.slots.payload[row]
                self.writer.advance(state, state.output_ids[state.consumed :], row)  # type: ignore[index]
            self.writer.finish()
        free = set(self.writer.free)
        return [row for row in ours if row not in free] if free else ours


@dataclass
class _StepCopy:
    """What the host needs of one V2 step, from its one device-to-host copy: each row's slot,
    local position (drafts before it), input id and position; the committed tokens the
    constrained requests' matchers have not seen, end to end (``history``); and per
    constrained slot, where its own start: ``(offset in history, first position, how many
    end the prompt)``."""

    row_slot: np.ndarray
    local: np.ndarray
    input_ids: np.ndarray
    pos: np.ndarray
    history: np.ndarray
    unseen: dict[int, tuple[int, int, int]]


class V2MaskFill:
    """V2: fill in ``apply``, after one device-to-host copy of what the step needs."""

    def __init__(self, writer: MaskWriter, slots: SlotTable, layout: Any) -> None:
        self.writer = writer
        self.slots = slots
        self.req_states = layout.req_states
        self.last_step: tuple[Any, _StepCopy] | None = None

    def before_update(self) -> None:
        """V2 never calls ``update_state``."""

    def after_update(self, batch_update: Any) -> None:
        """V2 never calls ``update_state``."""

    def rows_to_mask(self, rows: Rows, logits: torch.Tensor) -> list[int]:
        """Rows are (request, draft position) pairs; drafts are matched then undone.

        The host needs the tokens the device sampled: they come in the step's one
        device-to-host sync (``_fetch_step``). So a resumed request, or accepted drafts, cost
        no extra sync; closing needs no logits.
        """
        num_rows = rows.count
        self.writer.start_step()
        step = self._fetch_step(rows.ctx, num_rows)
        self.last_step = (rows.ctx, step)  # its row layout, for the content classes' readers
        ours = np.flatnonzero(self.slots.active[step.row_slot]).tolist()
        self.writer.ensure_rows(num_rows)
        for row in ours:
            slot = int(step.row_slot[row])
            state: RowState = self.slots.payload[slot]
            k = int(step.local[row])
            if k == 0:
                self.writer.advance(state, self._committed_tokens(state, slot, row, step), row)
            else:  # row k of a request: drafts fed at its rows 1..k
                self.writer.draft(state, row, step.input_ids[row - k + 1 : row + 1])
        self.writer.finish()
        free = set(self.writer.free)
        return [row for row in ours if row not in free] if free else ours

    def _fetch_step(self, ctx: Any, num_rows: int) -> _StepCopy:
        """The step's one device-to-host sync: one copy of the row layout and of each
        constrained request's committed tokens its matcher has not seen (gathered on the
        device from ``req_states.all_token_ids``; ``ctx.seq_lens_upper_bound_np`` bounds how
        many)."""
        batch_slots = ctx.idx_mapping_np
        mine = self.slots.active[batch_slots]
        slots = batch_slots[mine].astype(np.int64)
        tokens = self.req_states.all_token_ids.gpu
        bound = ctx.seq_lens_upper_bound_np[mine]
        start, count, back = self._unseen_spans(slots, bound, tokens.shape[1])
        offsets = np.cumsum(count) - count
        positions = np.repeat(start - offsets, count) + np.arange(int(count.sum()))
        index = torch.from_numpy(np.stack([np.repeat(slots, count), positions]))
        index = index.to(tokens.device, non_blocking=True)
        layout = (ctx.expanded_idx_mapping, ctx.expanded_local_pos, ctx.input_ids, ctx.pos)
        per_row = torch.stack([t.long() for t in layout]).flatten()
        parts = [per_row, tokens[index[0], index[1]].long()]
        host = fetch_to_host(torch.cat(parts))
        row_slot, local, input_ids, pos = host[: 4 * num_rows].reshape(4, num_rows)
        unseen = {
            int(s): (int(o), int(b), int(k))
            for s, o, b, k in zip(slots, offsets, start, back, strict=True)
        }
        return _StepCopy(row_slot, local, input_ids, pos, host[4 * num_rows :], unseen)

    def _unseen_spans(
        self, slots: np.ndarray, bound: np.ndarray, width: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per constrained request (``slots``), the span of ``all_token_ids`` (``width``
        wide) to copy: its first position, its length (to ``bound``, the sequence's upper
        bound), and how many of its tokens end the prompt."""
        states: list[RowState] = [self.slots.payload[s] for s in slots]
        consumed = np.array([state.consumed for state in states], dtype=np.int64)
        prompt_len = self.req_states.prompt_len.np[slots].astype(np.int64)
        # A stack still to read the prompt's end (the gate) gets its last tokens in this copy.
        back = np.array([s.reads_prompt() for s in states], dtype=np.int64)
        back = np.minimum(back, prompt_len)
        start = prompt_len + consumed - back
        end = np.minimum(bound.astype(np.int64), width)
        return start, np.maximum(end - start, 0), back

    @staticmethod
    def _committed_tokens(state: RowState, slot: int, row: int, step: _StepCopy) -> list[int]:
        """The tokens committed to ``slot``'s request that its matcher has not seen, up to the
        position of ``row`` (its first row this step); the prompt's end, when its stack reads
        it, goes to ``state.read_prompt`` first."""
        offset, first, tail = step.unseen[slot]
        new = max(int(step.pos[row]) + 1 - first, 0) if not state.failed else 0
        seen = step.history[offset : offset + new].tolist()
        if tail:
            if len(seen) < tail:  # in the prefill (its sample is discarded): next step
                return []
            state.read_prompt(seen[:tail])
            seen = seen[tail:]
        return seen
