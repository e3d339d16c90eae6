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

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger

from constrained.grammars import GrammarSpec, Vocab
from constrained.grammars.checked_matcher import CheckedMatcher
from constrained.grammars.closing import MAX_WITNESS_TOKENS, allowed_ids, find_witness
from constrained.grammars.llguidance_backend import LLGuidanceMatcher
from constrained.grammars.matcher import Matcher, fill_only, words_for
from constrained.processors.closing_plan import CANDIDATES, SLACK, ClosingPlan
from constrained.processors.reasoning_gate import (
    ReasoningGate,
    prompt_closes_thinking,
    prompt_tail_size,
)
from constrained.processors.runners import Rows
from constrained.processors.slots import SlotTable
from constrained.processors.transfer import Uploader, fetch_to_host

logger = init_logger(__name__)


@dataclass
class RowState:
    """One constrained request: its compile, its matcher and how far it has followed."""

    spec: GrammarSpec
    compiled: Future
    output_ids: list[int] | None  # V1's live output list; None under V2
    plan: ClosingPlan | None = None  # finishing by max_tokens (None: closing is off)
    gate: ReasoningGate | None = None  # thinking first (None: constrained from the start)
    prompt_pending: bool = False  # V2: the gate still has to look at the prompt's end
    matcher: Matcher | None = None
    consumed: int = 0  # output tokens seen (thinking included)
    failed: bool = False
    gate_budgeted: bool = False  # the gate's forcing point accounts for max_tokens
    stop_ids: tuple[int, ...] = ()  # its own stop tokens (generation config, stop_token_ids)

    def check_prompt(self, tail: list[int]) -> None:
        """Open the gate when the prompt already closed the thinking block."""
        self.prompt_pending = False
        gate = self.gate
        if gate is not None and prompt_closes_thinking(tail, gate.marker):
            gate.open = True

    def thinking(self) -> bool:
        """Still before the marker, and not forced to it next (its row costs no mask)."""
        gate = self.gate
        return (
            gate is not None
            and not gate.open
            and not self.prompt_pending
            and (gate.force_after is None or gate.seen + 1 < gate.force_after)
            and (self.plan is None or gate.seen + 1 < self.walk_at())
        )

    def walk_at(self) -> int:
        """Output tokens after which a thinking request with a budget walks for its answer's
        witness (to place the forced marker): a witness is at most MAX_WITNESS_TOKENS long."""
        assert self.gate is not None and self.plan is not None
        return self.plan.limit - len(self.gate.marker.ids) - (2 * MAX_WITNESS_TOKENS + SLACK)

    def prompt_tail_size(self) -> int:
        return prompt_tail_size(self.gate.marker) if self.gate is not None else 0

    def ready_matcher(self) -> Matcher | None:
        """The matcher, built once the compile is done (waits for it); None if it failed."""
        if self.matcher is None and not self.failed:
            try:
                self.matcher = self.compiled.result().matcher()
            except Exception as exc:  # admission compiled it; never take the engine down
                logger.error(
                    "constrained: %s compile failed in the engine (%s); the request is "
                    "allowed only end-of-sequence",
                    self.spec.kind,
                    exc,
                )
                self.failed = True
        return self.matcher


class MaskWriter:
    """The host bitmask (one int32 row of ``ceil(width / 32)`` words per logits row)."""

    def __init__(self, vocab: Vocab, device: torch.device) -> None:
        self.vocab = vocab
        self.eos = vocab.eos_token_id
        self.bitmask = torch.zeros(0, words_for(vocab.width), dtype=torch.int32)
        self.scratch = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)  # witness walks
        self._uploader = Uploader(device)
        self._llguidance: list[tuple[LLGuidanceMatcher, int]] = []
        self._narrowed: list[tuple[CheckedMatcher, int]] = []  # array checks, after the fill
        # Rows closing this step (restricted in ``close``, once the logits are known).
        self._closing: list[tuple[int, RowState]] = []
        self._closing_drafts: list[tuple[int, RowState, list[int]]] = []
        # Rows still thinking this step: no mask (their processors' cost is an unconstrained
        # request's), end-of-sequence banned so the answer always comes; with (row, token)
        # pairs each request bans besides: its own stop tokens, and the tokens that would
        # complete the marker carrying text past it.
        self.thinking: list[int] = []
        self.banned: tuple[list[int], list[int]] = ([], [])

    def start_step(self) -> None:
        self.thinking = []
        self.banned = ([], [])

    def ensure_rows(self, num_rows: int) -> None:
        if self.bitmask.shape[0] < num_rows:
            rows = max(num_rows, 2 * self.bitmask.shape[0], 8)
            self.bitmask = torch.zeros(rows, self.bitmask.shape[1], dtype=torch.int32)

    def advance(self, state: RowState, new: list[int], row: int) -> None:
        """Feed ``new`` committed tokens to a request's matcher, then queue or write its row."""
        gate = state.gate
        # (V2, mid-prefill, the prompt's end not read yet: its sample is discarded; the
        # grammar's row is written meanwhile.)
        if gate is not None and not gate.open and not state.prompt_pending:
            after = gate.feed(new)
            if after is None:
                state.consumed += len(new)
                self._thinking_row(state, row)
                return
            state.consumed += len(new) - len(after)  # the marker: the constraint starts after
            new = after
        try:
            matcher = state.ready_matcher()
            if matcher is not None:
                if new and not matcher.consume(new):
                    logger.warning("constrained: %s; allowing only end-of-sequence", matcher.error)
                state.consumed += len(new)
                plan = state.plan
                if plan is not None and matcher.error is None:
                    plan.after_tokens(matcher, self.vocab, new, state.consumed, self.scratch)
                    if plan.closing:
                        self._closing.append((row, state))
                self._write(matcher, row)
                return
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.failed, state.matcher = True, None
        fill_only(self.bitmask, row, [self.eos])

    def _thinking_row(self, state: RowState, row: int) -> None:
        """A row before the marker: free, or forced to the marker's next token."""
        gate = state.gate
        assert gate is not None
        # The walk waits until thinking could come near the budget: a long budget costs a
        # thinking row nothing.
        if state.plan is not None and not state.gate_budgeted and gate.seen >= state.walk_at():
            self._budget_gate(state)
        self._free_or_forced(state, gate, row)

    def _free_or_forced(self, state: RowState, gate: ReasoningGate, row: int) -> None:
        forced = gate.forced_token()
        if forced is not None:
            fill_only(self.bitmask, row, [forced])
            return
        self.thinking.append(row)
        bans = [*state.stop_ids, *gate.spills()]
        if bans:
            self.banned[0].extend([row] * len(bans))
            self.banned[1].extend(bans)

    def _budget_gate(self, state: RowState) -> None:
        """Force the marker early enough that the answer has its closing window left
        (twice its shortest completion, plus the slack) before ``max_tokens``."""
        state.gate_budgeted = True
        gate, plan = state.gate, state.plan
        matcher = state.ready_matcher()
        if gate is None or plan is None or matcher is None:
            return
        witness = find_witness(matcher, self.vocab, plan.limit, self.scratch)
        need = len(witness) if witness is not None else plan.limit
        latest = max(plan.limit - len(gate.marker.ids) - (2 * need + SLACK), 0)
        gate.force_after = latest if gate.force_after is None else min(gate.force_after, latest)

    def draft(self, state: RowState, row: int, drafts: np.ndarray) -> None:
        """A speculative row: the matcher advanced over ``drafts``, its row written, undone.

        Drafts are cut at the first negative id: vLLM feeds -1 placeholders for the draft rows
        of a step that starts inside the prefill (those rows' samples are rejected).
        """
        negative = np.flatnonzero(drafts < 0)
        tokens = drafts[: negative[0] if negative.size else len(drafts)].tolist()
        if state.gate is not None and not state.gate.open:  # still thinking before the drafts
            gate = state.gate.copy()
            after = gate.feed(tokens)
            if after is None:
                self._free_or_forced(state, gate, row)
                return
            state.ready_matcher()
            self._fill_after(state, row, after)
            return
        matcher = state.matcher
        if matcher is None or matcher.error is not None:
            fill_only(self.bitmask, row, [self.eos])
            return
        if state.plan is not None and state.plan.closing:  # written in ``close``
            self._closing_drafts.append((row, state, tokens))
            return
        self._fill_after(state, row, tokens)

    def _fill_after(self, state: RowState, row: int, tokens: list[int]) -> None:
        """Write the grammar's row after ``tokens`` (then undo them)."""
        matcher = state.matcher
        if matcher is None:
            fill_only(self.bitmask, row, [self.eos])
            return
        try:
            accepted = matcher.try_consume(tokens)
            if accepted == len(tokens):
                matcher.fill(self.bitmask, row)
            else:  # an earlier draft is already masked, so this row's sample is discarded
                fill_only(self.bitmask, row, [self.eos])
            matcher.rollback(accepted)
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.failed, state.matcher = True, None
            fill_only(self.bitmask, row, [self.eos])

    def _write(self, matcher: Matcher, row: int) -> None:
        backend = matcher.inner if isinstance(matcher, CheckedMatcher) else matcher
        if isinstance(backend, LLGuidanceMatcher):  # filled together, in llguidance's pool
            self._llguidance.append((backend, row))
            if backend is not matcher:
                self._narrowed.append((matcher, row))
        else:
            matcher.fill(self.bitmask, row)

    def finish(self) -> None:
        """Write the rows queued for llguidance's parallel fill, then their array checks."""
        if self._llguidance:
            pairs, self._llguidance = self._llguidance, []
            LLGuidanceMatcher.fill_many(pairs, self.bitmask)
        narrowed, self._narrowed = self._narrowed, []
        for matcher, row in narrowed:
            try:
                matcher.narrow(self.bitmask, row)
            except Exception:
                logger.exception("constrained: array checks failed; ending the request")
                matcher.error = "array checks failed"
                fill_only(self.bitmask, row, [self.eos])

    def close(
        self, logits: torch.Tensor, top: np.ndarray | None = None, may_fetch: bool = True
    ) -> None:
        """Narrow the closing rows to tokens that still finish in time (``ClosingPlan``).

        The candidates are each row's most likely tokens: ``top`` (every row's, fetched with
        V2's one copy), or one small top-k of the closing rows read here when ``may_fetch``
        (V1: on a GPU, a device-to-host copy in steps where some request is closing).
        Otherwise (V2, a request that closes from its first step) only the witness's token.
        """
        closing, self._closing = self._closing, []
        drafts, self._closing_drafts = self._closing_drafts, []
        if not closing:
            for row, state, tokens in drafts:  # their main row was not closing after all
                self._fill_after(state, row, tokens)
            return
        if top is None and not may_fetch:
            top_of = {row: np.zeros(0, dtype=np.int64) for row, _ in closing}
        elif top is None:
            rows = [row for row, _ in closing]
            index = torch.tensor(rows, device=logits.device)
            picked = logits.index_select(0, index).topk(top_k(logits), dim=1).indices
            top_of = dict(zip(rows, fetch_to_host(picked), strict=True))
        else:
            top_of = {row: top[row] for row, _ in closing}
        for row, state in closing:
            candidates = top_of[row]
            matcher, plan = state.matcher, state.plan
            if matcher is None or plan is None or matcher.error is not None:
                continue
            allowed = allowed_ids(self.bitmask[row], self.vocab.width)
            keep = plan.restrict(
                matcher, self.vocab, candidates.tolist(), allowed, state.consumed, self.scratch
            )
            fill_only(self.bitmask, row, keep)
        for row, state, tokens in drafts:
            keep = state.plan.draft_allows(tokens, self.eos) if state.plan else None
            if keep is None:  # off the checked path: the target rejects this row's sample
                self._fill_after(state, row, tokens)
            else:
                fill_only(self.bitmask, row, keep)

    def on_device(self, num_rows: int) -> torch.Tensor:
        """The first ``num_rows`` rows on the logits' device (non-blocking upload)."""
        return self._uploader.upload({"bitmask": self.bitmask}, rows=num_rows)["bitmask"][:num_rows]


def top_k(logits: torch.Tensor) -> int:
    return min(CANDIDATES, logits.shape[1])


class V1MaskFill:
    """V1: fill the next masks in a worker thread while the model runs."""

    def __init__(self, writer: MaskWriter, slots: SlotTable, layout: Any) -> None:
        self.writer = writer
        self.slots = slots
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="constrained-mask")
        self._pending: Future | None = None
        self._filled: list[int] = []
        self._num_rows = 0

    def before_update(self) -> None:
        """Let the fill of the last step finish before the batch changes under it."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def after_update(self, batch_update: Any) -> None:
        """Start filling the rows of the step about to run."""
        if batch_update is not None:
            self._num_rows = batch_update.batch_size
        rows = self._ours(self._num_rows)
        self._filled = []
        self.writer.start_step()
        if rows:
            self.writer.ensure_rows(max(rows) + 1)
            if all(self.slots.payload[row].thinking() for row in rows):
                self._fill(rows)  # a few bytes compared per row: cheaper than a thread handoff
            else:
                self._pending = self._filler.submit(self._fill, rows)

    def _ours(self, num_rows: int) -> list[int]:
        return np.flatnonzero(self.slots.active[:num_rows]).tolist()

    def _fill(self, rows: list[int]) -> None:
        """Consume each row's new output tokens and write its mask (worker thread)."""
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

    def rows_to_mask(self, rows: Rows, logits: torch.Tensor) -> list[int]:
        """Finish the fill (rows whose token was a placeholder at update time), narrow the
        closing rows, and return the rows to mask."""
        self.before_update()
        ours = self._ours(rows.count)
        missing = sorted(set(ours) - set(self._filled))
        if missing:
            self.writer.ensure_rows(rows.count)
            for row in missing:
                state: RowState = self.slots.payload[row]
                self.writer.advance(state, state.output_ids[state.consumed :], row)  # type: ignore[index]
            self.writer.finish()
        self.writer.close(logits)
        thinking = set(self.writer.thinking)
        return [row for row in ours if row not in thinking] if thinking else ours


class V2MaskFill:
    """V2: fill in ``apply``, after one device-to-host copy of what the step needs."""

    def __init__(self, writer: MaskWriter, slots: SlotTable, layout: Any) -> None:
        self.writer = writer
        self.slots = slots
        self.req_states = layout.req_states

    def before_update(self) -> None:
        """V2 never calls ``update_state``."""

    def after_update(self, batch_update: Any) -> None:
        """V2 never calls ``update_state``."""

    def rows_to_mask(self, rows: Rows, logits: torch.Tensor) -> list[int]:
        """Rows are (request, draft position) pairs; drafts are matched then undone.

        The host needs the tokens the device sampled, so this is the step's one
        device-to-host sync: one copy of the row layout and of each constrained request's
        committed tokens its matcher has not seen (gathered on the device from
        ``req_states.all_token_ids``; ``ctx.seq_lens_upper_bound_np`` bounds how many). So a
        resumed request, or accepted drafts, cost no extra sync. When a request may be
        closing (``ClosingPlan.near``), every row's top-k token ids ride in the same copy.
        """
        ctx, num_rows = rows.ctx, rows.count
        self.writer.start_step()
        batch_slots = ctx.idx_mapping_np
        mine = self.slots.active[batch_slots]
        slots = batch_slots[mine].astype(np.int64)
        tokens = self.req_states.all_token_ids.gpu
        states: list[RowState] = [self.slots.payload[s] for s in slots]
        consumed = np.array([state.consumed for state in states], dtype=np.int64)
        prompt_len = self.req_states.prompt_len.np[slots].astype(np.int64)
        # A gate not yet told how the prompt ends gets the prompt's last tokens in this copy.
        back = np.array(
            [s.prompt_tail_size() if s.prompt_pending else 0 for s in states], dtype=np.int64
        )
        back = np.minimum(back, prompt_len)
        start = prompt_len + consumed - back
        end = np.minimum(ctx.seq_lens_upper_bound_np[mine].astype(np.int64), tokens.shape[1])
        count = np.maximum(end - start, 0)
        offsets = np.cumsum(count) - count
        positions = np.repeat(start - offsets, count) + np.arange(int(count.sum()))
        index = torch.from_numpy(np.stack([np.repeat(slots, count), positions]))
        index = index.to(tokens.device, non_blocking=True)
        layout = (ctx.expanded_idx_mapping, ctx.expanded_local_pos, ctx.input_ids, ctx.pos)
        per_row = torch.stack([t.long() for t in layout]).flatten()
        parts = [per_row, tokens[index[0], index[1]].long()]
        near = any(self._near(self.slots.payload[s]) for s in slots)
        if near:
            parts.append(logits[:num_rows].topk(top_k(logits), dim=1).indices.flatten())
        host = fetch_to_host(torch.cat(parts))
        row_slot, local, input_ids, pos = host[: 4 * num_rows].reshape(4, num_rows)
        top = None
        if near:
            top = host[-num_rows * top_k(logits) :].reshape(num_rows, top_k(logits))
            host = host[: -num_rows * top_k(logits)]
        history = host[4 * num_rows :]
        unseen = {
            int(s): (int(o), int(b), int(k))
            for s, o, b, k in zip(slots, offsets, start, back, strict=True)
        }

        ours = np.flatnonzero(self.slots.active[row_slot]).tolist()
        self.writer.ensure_rows(num_rows)
        for row in ours:
            slot = int(row_slot[row])
            state: RowState = self.slots.payload[slot]
            k = int(local[row])
            if k == 0:
                offset, first, tail = unseen[slot]
                new = max(int(pos[row]) + 1 - first, 0) if not state.failed else 0
                seen = history[offset : offset + new].tolist()
                if tail:
                    if len(seen) < tail:  # still in the prefill: look again next step
                        seen = []
                    else:
                        state.check_prompt(seen[:tail])
                        seen = seen[tail:]
                self.writer.advance(state, seen, row)
            else:  # row k of a request: drafts fed at its rows 1..k
                self.writer.draft(state, row, input_ids[row - k + 1 : row + 1])
        self.writer.finish()
        self.writer.close(logits, top, may_fetch=False)  # the step's one copy is spent
        thinking = set(self.writer.thinking)
        return [row for row in ours if row not in thinking] if thinking else ours

    @staticmethod
    def _near(state: RowState) -> bool:
        return state.plan is not None and state.plan.near(state.consumed)
