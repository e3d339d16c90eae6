"""``json_schema`` / ``regex`` / ``grammar``: mask every token the constraint does not allow.

Each constrained request gets a matcher (``constrained.grammars``) that follows its output
and writes its row of an int32 bitmask; the mask is applied to the logits before temperature,
after our bias and penalties. When the constraint is complete only end-of-sequence is
allowed, so the request stops with ``finish_reason == "stop"``; a request whose matcher fails
(its compile failed in the engine, or a token it refused was forced in) is allowed only
end-of-sequence from then on, so it ends at once instead of running on unconstrained.

Model Runner V1 calls ``update_state`` before the forward pass: the masks for the coming
step are filled then, in a worker thread, while the model runs. Under V2 masks are filled in
``apply`` (V2 passes sampled and draft tokens only there); llguidance rows in parallel.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.logger import init_logger

from constrained.grammars import GrammarError, GrammarSpec, compiler_for, load_vocab
from constrained.grammars.llguidance_backend import LLGuidanceMatcher
from constrained.grammars.matcher import Matcher, fill_only, words_for
from constrained.options import OptionError, Options, options_from_params
from constrained.processors.base import DualInterfaceProcessor, Tokens, _frontend_model_config
from constrained.processors.functional import apply_token_bitmask
from constrained.processors.slots import Column

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)


def spec_of(options: Options) -> GrammarSpec | None:
    """The ``GrammarSpec`` of a request's options, or ``None`` when it has no constraint."""
    constraint = options.constraint()
    if constraint is None:
        return None
    kind, source = constraint
    kwargs: dict[str, Any] = {}
    if options.whitespace is not None:
        kwargs["whitespace"] = options.whitespace
    if options.max_whitespace is not None:
        kwargs["max_whitespace"] = options.max_whitespace
    if options.disable_additional_properties:
        kwargs["close_objects"] = True
    return GrammarSpec(kind, source, options.grammar_backend or "auto", **kwargs)  # type: ignore[arg-type]


@dataclass
class RowState:
    """One constrained request: its compile, its matcher and how far it has followed."""

    spec: GrammarSpec
    compiled: Future
    output_ids: list[int] | None  # V1's live output list; None under V2
    matcher: Matcher | None = None
    consumed: int = 0
    failed: bool = field(default=False)

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


class GrammarMaskProcessor(DualInterfaceProcessor):
    """Masks tokens a request's JSON schema, regex or grammar does not allow.

    Formula: ``l'[t] = l[t]`` if the constraint allows ``t`` next, else ``-inf``; ids past
    the tokenizer are never allowed. Compiles are cached per (constraint, backend,
    whitespace, tokenizer) and run in worker threads; the first request with a new schema
    pays its compile at admission (``validate_params``), within the time limit.

    Example::

        SamplingParams(extra_args={"json_schema": {"type": "object", ...}})
        SamplingParams(extra_args={"regex": r"\\d{3}-\\d{4}"})
    """

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        model_config = vllm_config.model_config
        self.vocab = load_vocab(_tokenizer_path(model_config), self.logits_width)
        self.eos = self.vocab.eos_token_id
        self.compiler = compiler_for(self.vocab)
        self.bitmask = torch.zeros(0, words_for(self.vocab.width), dtype=torch.int32)
        self._device_bitmask: torch.Tensor | None = None
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="constrained-mask")
        self._pending: Future | None = None
        self._filled_rows: list[int] = []
        self.num_rows = 0

    @classmethod
    def columns(cls) -> dict[str, Column]:
        return {"constrained": Column(torch.bool, False)}

    def is_argmax_invariant(self) -> bool:
        return False

    # ---- admission -----------------------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Parse the options and compile the constraint now, so a bad one is refused."""
        model_config = _frontend_model_config()
        width = int(model_config.get_vocab_size()) if model_config is not None else None
        options = options_from_params(sampling_params, logits_width=width)
        if options is not None and model_config is not None:
            compile_for_admission(options, model_config)

    # ---- per-request state ---------------------------------------------------------

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        spec = spec_of(options)
        if spec is None:
            return False
        output_ids = tokens[1] if tokens is not None else None
        self.slots.write(slot, constrained=True)
        self.slots.payload[slot] = RowState(spec, self.compiler.submit(spec), output_ids)
        return True

    # ---- Model Runner V1: fill next masks during the forward pass ------------------

    def update_state(self, batch_update: Any) -> None:
        self._wait_for_fill()
        super().update_state(batch_update)
        if batch_update is not None:
            self.num_rows = batch_update.batch_size
        rows = self._constrained_rows(self.num_rows)
        self._filled_rows = []
        if rows:
            self._ensure_rows(max(rows) + 1)
            self._pending = self._filler.submit(self._fill_v1_rows, rows)

    def _wait_for_fill(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _constrained_rows(self, num_rows: int) -> list[int]:
        active = self.slots.active[:num_rows]
        return np.flatnonzero(active).tolist()

    def _fill_v1_rows(self, rows: list[int]) -> None:
        """Consume each row's new output tokens and write its mask (worker thread)."""
        done, llg = [], []
        for row in rows:
            state: RowState = self.slots.payload[row]
            new = state.output_ids[state.consumed :]  # type: ignore[index]
            if -1 in new:  # async scheduling: the token arrives just before apply
                continue
            self._advance(state, new, row, llg)
            done.append(row)
        self._fill_llguidance(llg)
        self._filled_rows = done

    def _advance(self, state: RowState, new: list[int], row: int, llg: list) -> None:
        """Feed ``new`` tokens to a row's matcher and queue or write its mask.

        Any backend failure ends that request (end-of-sequence only), never the engine.
        """
        try:
            matcher = state.ready_matcher()
            if matcher is not None:
                if new and not matcher.consume(new):
                    logger.warning("constrained: %s; allowing only end-of-sequence", matcher.error)
                state.consumed += len(new)
                if isinstance(matcher, LLGuidanceMatcher):
                    llg.append((matcher, row))
                else:
                    matcher.fill(self.bitmask, row)
                return
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.failed, state.matcher = True, None
        fill_only(self.bitmask, row, [self.eos])

    def _fill_llguidance(self, pairs: list) -> None:
        if pairs:
            LLGuidanceMatcher.fill_many(pairs, self.bitmask)

    # ---- both runners ----------------------------------------------------------------

    def apply_rows(
        self, logits: torch.Tensor, row_slots: torch.Tensor | None, ctx: Any = None
    ) -> torch.Tensor:
        if ctx is None:
            rows = self._finish_v1_fill(logits.shape[0])
        else:
            rows = self._fill_v2_rows(logits.shape[0], ctx)
        if rows:
            apply_token_bitmask(logits, self._bitmask_on(logits.device, logits.shape[0]), rows)
        return logits

    def _finish_v1_fill(self, num_rows: int) -> list[int]:
        self._wait_for_fill()
        rows = self._constrained_rows(num_rows)
        missing = sorted(set(rows) - set(self._filled_rows))
        if missing:  # rows whose newest token was a placeholder at update_state
            self._ensure_rows(num_rows)
            llg: list = []
            for row in missing:
                state: RowState = self.slots.payload[row]
                self._advance(state, state.output_ids[state.consumed :], row, llg)  # type: ignore[index]
            self._fill_llguidance(llg)
        return rows

    def _fill_v2_rows(self, num_rows: int, ctx: Any) -> list[int]:
        """V2: rows are (request, draft position) pairs; drafts are matched then undone."""
        row_slots = ctx.expanded_idx_mapping.cpu().numpy()
        rows = np.flatnonzero(self.slots.active[row_slots]).tolist()
        if not rows:
            return []
        local = ctx.expanded_local_pos.cpu().numpy()
        input_ids = ctx.input_ids.cpu().numpy()
        pos = ctx.pos.cpu().numpy()
        self._ensure_rows(num_rows)
        llg: list = []
        for row in rows:
            slot = int(row_slots[row])
            state: RowState = self.slots.payload[slot]
            if int(local[row]) == 0:
                self._advance(
                    state, self._new_tokens_v2(state, slot, row, input_ids, pos), row, llg
                )
            else:
                self._fill_draft_row(state, row, local, input_ids)
        self._fill_llguidance(llg)
        return rows

    def _new_tokens_v2(self, state: RowState, slot: int, row: int, input_ids, pos) -> list[int]:
        """The request's committed output tokens its matcher has not seen yet."""
        prompt_len = int(self.req_states.prompt_len.np[slot])
        new = int(pos[row]) + 1 - prompt_len - state.consumed
        if new <= 0 or state.failed:
            return []
        if new == 1:  # the usual case: the token fed at this row is the one sampled last
            return [int(input_ids[row])]
        # Resumed, or several drafts accepted: read the committed history.
        start = prompt_len + state.consumed
        return self.req_states.all_token_ids.gpu[slot, start : start + new].cpu().tolist()

    def _fill_draft_row(self, state: RowState, row: int, local, input_ids) -> None:
        """Row ``k`` of a request: its matcher advanced over the drafts fed at rows 1..k."""
        matcher = state.matcher
        k = int(local[row])
        drafts = [int(t) for t in input_ids[row - k + 1 : row + 1]]
        if matcher is None or matcher.error is not None:
            fill_only(self.bitmask, row, [self.eos])
            return
        try:
            accepted = matcher.try_consume(drafts)
            if accepted == len(drafts):
                matcher.fill(self.bitmask, row)
            else:  # an earlier draft is already masked, so this row's sample is discarded
                fill_only(self.bitmask, row, [self.eos])
            matcher.rollback(accepted)
        except Exception:
            logger.exception("constrained: grammar matcher failed; ending the request")
            state.failed, state.matcher = True, None
            fill_only(self.bitmask, row, [self.eos])

    # ---- bitmask buffers -------------------------------------------------------------

    def _ensure_rows(self, num_rows: int) -> None:
        if self.bitmask.shape[0] < num_rows:
            rows = max(num_rows, 2 * self.bitmask.shape[0], 8)
            self.bitmask = torch.zeros(rows, self.bitmask.shape[1], dtype=torch.int32)

    def _bitmask_on(self, device: torch.device, num_rows: int) -> torch.Tensor:
        host = self.bitmask[:num_rows]
        if device.type == "cpu":
            return host
        if self._device_bitmask is None or self._device_bitmask.shape[0] < num_rows:
            self._device_bitmask = torch.empty_like(self.bitmask, device=device)
        self._device_bitmask[:num_rows].copy_(host, non_blocking=False)
        return self._device_bitmask[:num_rows]


def compile_for_admission(options: Options, model_config: Any) -> None:
    """Compile the request's constraint (if any) with the served tokenizer, or refuse it.

    Raises:
        OptionError: naming the constraint's field, when it does not compile in time.
    """
    spec = spec_of(options)
    if spec is None:
        return
    width = int(model_config.get_vocab_size())
    vocab = load_vocab(_tokenizer_path(model_config), width)
    try:
        compiler_for(vocab).compile(spec)
    except GrammarError as exc:
        raise OptionError(spec.kind, str(exc)) from None
    except Exception as exc:  # a backend bug is still this request's problem only
        raise OptionError(spec.kind, f"cannot be compiled ({exc})") from None


def _tokenizer_path(model_config: Any) -> str:
    return str(getattr(model_config, "tokenizer", None) or model_config.model)
