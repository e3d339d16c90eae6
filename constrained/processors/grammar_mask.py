"""``json_schema`` / ``regex`` / ``grammar`` / ``choice`` / ``json_object`` /
``structural_tag``: mask every token the constraint does not allow.

Each constrained request gets a matcher (``constrained.grammars``) that follows its output
and writes its row of an int32 bitmask (``mask_fill``); the mask is applied to the logits
(``functional.apply_token_bitmask``) before temperature, after our bias and penalties. When
the constraint is complete only end-of-sequence is allowed, so the request stops with
``finish_reason == "stop"``; a request whose matcher fails (its compile failed in the engine,
or a token it refused was forced in) is allowed only end-of-sequence from then on, so it ends
at once instead of running on unconstrained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger

from constrained.admission import (
    closes_at_budget,
    served_vocab,
    spec_of,
    warm_when_served,
)
from constrained.grammars import compiler_for
from constrained.grammars.marker import marker_for
from constrained.grammars.reasoning_gate import Thinking
from constrained.grammars.start_row import kept_start_row
from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.content_rows import content_rows_for
from constrained.processors.functional import apply_token_bitmask
from constrained.processors.mask_fill import (
    MaskWriter,
    ResumeShelf,
    RowState,
    V1MaskFill,
    V2MaskFill,
)
from constrained.processors.runners import Rows
from constrained.processors.slots import Column
from constrained.reasoning_parser import parser_applies, thinking_ends

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)


class GrammarMaskProcessor(DualInterfaceProcessor):
    """Masks tokens a request's JSON schema, regex or grammar does not allow.

    Formula: ``l'[t] = l[t]`` if the constraint allows ``t`` next, else ``-inf``; ids past
    the tokenizer are never allowed. A constraint is compiled once, at admission
    (``validate_params``, within the time limit); the engine loads that compiled grammar from
    the store (``grammars/store.py``) in a worker thread when the request joins.

    Example::

        SamplingParams(extra_args={"json_schema": {"type": "object", ...}})
        SamplingParams(extra_args={"regex": r"\\d{3}-\\d{4}"})
    """

    OPTIONS = frozenset(
        {"json_schema", "regex", "grammar", "grammar_backend", "whitespace", "max_whitespace",
         "disable_additional_properties", "close_at_max_tokens", "choice", "json_object",
         "structural_tag", "reasoning_end", "max_reasoning_tokens"}
    )  # fmt: skip

    # Built by the first constrained request (``_build``), not with the engine: loading the
    # tokenizer and warming the backends' tables took 2 s on the engine's start-up path and
    # slowed the rest of it by half again on two cores (#55: 13 s -> 27 s to start). The
    # vocabulary's tables are built as soon as that loads nothing (``warm_when_served``).
    LAZY = frozenset({"vocab", "compiler", "writer", "fill", "thinking_stops"})

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        self.vllm_config = vllm_config
        self.resumed = ResumeShelf()  # what closing knew, for requests vLLM preempts
        self.content_rows = content_rows_for(self.layout, vllm_config)
        self.content_rows.publish(self.slots)
        if self.samples_here:
            parser = parser_applies(vllm_config) != ""
            warm_when_served(vllm_config.model_config, self.logits_width, parser)

    def __getattr__(self, name: str) -> Any:
        # Only called for a missing attribute: once built, the parts are plain attributes.
        if name in GrammarMaskProcessor.LAZY and self.samples_here:
            self._build()
            return self.__dict__[name]
        raise AttributeError(name)

    def _build(self) -> None:
        """The vocabulary, compiler, mask writer and fill (a pipeline stage that never samples
        has none)."""
        parser = parser_applies(self.vllm_config) != ""  # (it reads the served tokenizer)
        config = self.vllm_config.model_config
        vocab = served_vocab(config, self.logits_width, reads_tokenizer=parser)
        # Banned while a request thinks: end-of-sequence (the answer must come) and the tokens
        # the engine's reasoning parser reads as an implicit end (reasoning_parser.py).
        served = vocab.hf_tokenizer if parser else None
        implicit = thinking_ends(self.vllm_config, served).implicit_ids
        writer = MaskWriter(vocab, self.layout.device)
        fill = self.layout.pick(V1MaskFill, V2MaskFill)(writer, self.slots, self.layout)
        # All at once, after everything that can fail: a failed build leaves no part behind.
        self.vocab, self.compiler, self.writer, self.fill = vocab, compiler_for(vocab), writer, fill
        self.thinking_stops = frozenset({vocab.eos_token_id, *implicit})
        self.content_rows.publish_fill(fill, vocab)

    def columns(self) -> dict[str, Column]:
        return {"constrained": Column(torch.bool, False)}

    def is_argmax_invariant(self) -> bool:
        return False

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        spec = spec_of(options)
        if spec is None:
            return False
        output_ids = tokens[1] if tokens is not None else None
        compiled = self.compiler.submit(spec)  # (builds the lazy parts first, before the slot)
        self.slots.write(slot, constrained=True)
        limit = params.max_tokens if closes_at_budget(options, params) else None
        state = RowState(spec, compiled, output_ids, limit)
        if options.reasoning_end is None and not compiled.done():  # (admission kept it)
            try:
                state.start_row = kept_start_row(self.compiler, spec, limit)
            except Exception:  # (the row then waits for its compile, as without one)
                logger.exception("constrained: the store's start row was not read")
        old = self.resumed.swap(params, state)  # a preempted run of this request, if any
        if limit is not None:
            state.hints = self.resumed.hints(old, self.vocab, self.writer.scratch)
        if options.spares_structure():  # its penalties read which tokens are content
            json = spec.kind == "json_schema"
            state.content = self.resumed.content(old, json)
            if options.has_penalties():  # whitespace at structure rows: damped
                state.content.damping = (
                    options.repetition_penalty or 1.0,
                    options.frequency_penalty or 0.0,
                    options.presence_penalty or 0.0,
                )
        if options.reasoning_end is not None:
            marker = marker_for(self.vocab, options.reasoning_end)
            # Its own stop tokens end it too (the generation config's other end-of-sequence
            # ids, stop_token_ids): banned with the rest while it thinks.
            # (Not the marker's own tokens: it must stay writable.)
            writes_marker = {t for ids in marker.rest for t in ids}
            own = params.all_stop_token_ids - self.thinking_stops - writes_marker
            stops = (*sorted(self.thinking_stops), *sorted(own))
            state.thinking = Thinking(marker, options.max_reasoning_tokens, stops)
            # The stack now: its gate waits for no compile (the answer's layers are built
            # when first needed), and reads the prompt's end.
            state.ready_matcher(self.vocab, self.writer.scratch)
            back = state.reads_prompt()
            if tokens is not None and back:  # V1: the prompt is here; V2 reads its end in apply
                state.read_prompt(list(tokens[0][-back:]))
        self.slots.payload[slot] = state
        return True

    def update_state(self, batch_update: Any) -> None:
        if not self.samples_here:
            return super().update_state(batch_update)
        if "fill" in self.__dict__:  # (before the first constrained request: nothing to wait for)
            self.fill.before_update()
        super().update_state(batch_update)
        if "fill" in self.__dict__:
            self.fill.after_update(batch_update)

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        masked = self.fill.rows_to_mask(rows, logits)
        if masked:
            apply_token_bitmask(logits, self.writer.on_device(rows.count), masked)
        if self.writer.damped:  # requests that spare the structure, after whitespace
            self.writer.damp_whitespace(logits)
        banned_rows, banned_ids = self.writer.banned
        if banned_rows:  # free rows (thinking): no mask, only their bans
            pairs = torch.tensor([banned_rows, banned_ids], device=logits.device)
            logits[pairs[0], pairs[1]] = float("-inf")
        return logits
