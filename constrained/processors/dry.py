"""DRY, "don't repeat yourself" (llama.cpp's ``dry_*`` options): penalize extending a repeat.

The math is ``dry_math``; each row's recent tokens (prompt and output) come from ``history``
(host lists under Model Runner V1, device tables under V2, chosen once at build). Under V2 the
same math runs as two Triton launches per step (``dry_kernel``, reading the device tables
itself; ``CONSTRAINED_DRY_KERNEL=0``: the torch ops). Sequence
breakers become, per distinct breaker list, a ``[vocab]`` mask of the tokens whose text
contains one of them (``BreakerMasks``), built once from the served tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from constrained.options import DRY_DEFAULT_BREAKERS, Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.content_rows import content_rows_for, row_flags, spared_rows
from constrained.processors.dry_kernel import dry_penalize_kernel
from constrained.processors.dry_math import dry_penalize, max_exponent, repeat_lengths
from constrained.processors.history import row_history
from constrained.processors.runners import Rows
from constrained.processors.slots import Column
from constrained.settings import settings

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

DEFAULT_BASE = 1.75  # llama.cpp's defaults
DEFAULT_ALLOWED_LENGTH = 2


class DryProcessor(DualInterfaceProcessor):
    """DRY (koboldcpp / llama.cpp): a token that would extend a repeat of ``n`` tokens,
    ``n >= dry_allowed_length``, gets ``logit -= dry_multiplier * dry_base ** (n -
    dry_allowed_length)`` (exponent clamped as llama.cpp clamps it against float overflow).

    ``n`` is the longest run of the newest tokens that also occurs ending just before that
    token, within the last ``dry_penalty_last_n`` tokens of prompt + output (-1: all of them).
    A repeat never reaches back past the most recent sequence breaker, and breaker tokens
    themselves are never penalized. Runs before temperature; greedy requests are penalized
    too (it is a penalty, not a sampling filter).

    Example::

        SamplingParams(extra_args={"dry_multiplier": 0.8, "dry_base": 1.75,
                                   "dry_allowed_length": 2, "dry_penalty_last_n": -1})
    """

    OPTIONS = frozenset(
        {"dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
         "dry_sequence_breakers", "penalize_structure"}
    )  # fmt: skip

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        self.max_len = _max_model_len(vllm_config)
        self.breakers = BreakerMasks(
            self.logits_width, self.layout.device, _token_bytes(vllm_config)
        )
        self.history = row_history(self.slots, self.layout, "dry_window", output_only=False)
        self.content = content_rows_for(self.layout, vllm_config)
        # Decided once: under V2 the Triton kernels read the token tables themselves.
        self.on_triton = self.layout.pick(False, settings().dry_kernel)

    def columns(self) -> dict[str, Column]:
        return {
            # float32, as llama.cpp keeps them; the penalty is then computed in float64
            "dry_multiplier": Column(torch.float32, 0.0),
            "dry_base": Column(torch.float32, DEFAULT_BASE),
            "dry_allowed": Column(torch.int64, DEFAULT_ALLOWED_LENGTH),
            "dry_window": Column(torch.int64, 0),  # 0: the whole sequence
            "dry_cap": Column(torch.int64, 0),  # repeat lengths never matter beyond this
            "dry_exponent_cap": Column(torch.int64, 0),  # 0: no clamp
            "dry_breakers": Column(torch.int64, 0),  # index into BreakerMasks
            "dry_spares": Column(torch.bool, False),  # penalize_structure off (content only)
        }

    def is_argmax_invariant(self) -> bool:
        return False

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if not options.has_dry():
            return False
        base = options.dry_base if options.dry_base is not None else DEFAULT_BASE
        allowed = options.dry_allowed_length or DEFAULT_ALLOWED_LENGTH
        window = options.dry_penalty_last_n
        window = 0 if window is None or window < 0 else window
        exponent_cap = max_exponent(base)
        cap = allowed + exponent_cap if exponent_cap else self.max_len
        breakers = options.dry_sequence_breakers
        self.slots.write(
            slot,
            dry_multiplier=options.dry_multiplier,
            dry_base=base,
            dry_allowed=allowed,
            dry_window=window,
            dry_cap=min(cap, self.max_len),
            dry_exponent_cap=exponent_cap,
            dry_breakers=self.breakers.index(
                tuple(DRY_DEFAULT_BREAKERS if breakers is None else breakers)
            ),
            dry_spares=options.spares_structure(),
        )
        if tokens is not None:
            self.slots.payload[slot] = tokens  # V1: (prompt, vLLM's live output list)
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        spared = spared_rows(self.content, rows, self.slots.host_values["dry_spares"])
        if self.on_triton:
            return dry_penalize_kernel(
                logits,
                rows.ctx,
                self.layout.req_states.all_token_ids.gpu,
                self.slots.device_tables,
                self.breakers.table,
                self.history.width(rows),
                row_flags(spared, rows.count, logits.device),
            )
        history = self.history(rows)
        if history.shape[1] < 2:
            return logits
        gather = self.slots.gather
        breaker = self.breakers.lookup(gather("dry_breakers", rows), history)
        caps = self.slots.host_values["dry_cap"][self.slots.active]
        lengths = repeat_lengths(
            history,
            breaker,
            gather("dry_cap", rows),
            int(caps.max()),
            stop_early=self.layout.host_reads_free,
        )
        multiplier = gather("dry_multiplier", rows)
        if spared.size:  # structure rows: a zero multiplier leaves their bits as they are
            multiplier = multiplier.index_fill(0, torch.from_numpy(spared).to(logits.device), 0.0)
        return dry_penalize(
            logits,
            history,
            lengths,
            breaker,
            gather("dry_allowed", rows),
            multiplier,
            gather("dry_base", rows),
            gather("dry_exponent_cap", rows),
        )


class BreakerMasks:
    """Per distinct breaker list, the tokens that are single-token sequence breakers.

    As llama.cpp's ``get_overlapping_token_sequences``: a token whose text (its bytes)
    contains a breaker string is a breaker. Lists are built once and kept as rows of a
    ``[lists, vocab]`` bool table on the device (a new list adds a row: one vocab of bytes).
    """

    def __init__(self, width: int, device: torch.device, token_bytes: Callable[[], list]) -> None:
        self.width = width
        self.device = device
        self.token_bytes = token_bytes
        self.ids: dict[tuple[str, ...], int] = {}
        self.table = torch.zeros(0, width, dtype=torch.bool, device=device)

    def index(self, breakers: tuple[str, ...]) -> int:
        if breakers not in self.ids:
            mask = torch.zeros(1, self.width, dtype=torch.bool)
            needles = [b.encode() for b in breakers]
            for token, text in enumerate(self.token_bytes()[: self.width]):
                if text and any(needle in text for needle in needles):
                    mask[0, token] = True
            self.table = torch.cat([self.table, mask.to(self.device)])
            self.ids[breakers] = len(self.ids)
        return self.ids[breakers]

    def lookup(self, lists: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """[rows, width] bool: whether each history token breaks its row's repeats."""
        if self.table.shape[0] == 0:
            return torch.zeros_like(history, dtype=torch.bool)
        return self.table[lists.unsqueeze(1), history.clamp(min=0)] & (history >= 0)


def _max_model_len(vllm_config: Any) -> int:
    model_config = getattr(vllm_config, "model_config", None)
    return int(getattr(model_config, "max_model_len", 0) or 1 << 20)


def _token_bytes(vllm_config: Any) -> Callable[[], list]:
    """The served tokenizer's token bytes, loaded on first use (only DRY requests need it)."""

    def load() -> list:
        from constrained.admission import served_vocab

        return served_vocab(vllm_config.model_config).token_bytes()

    return load
