"""``no_repeat_ngram_size``: never repeat an n-gram of the output (as the OCR models' processors).

The math is ``ngram_math``; each row's recent output tokens come from ``history`` (host lists
under Model Runner V1, device tables under V2, chosen once at build). Where Triton compiles
under V2, the history, the bans and the mask are one launch (``ngram_kernel``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.content_rows import content_rows_for, row_flags, spared_rows
from constrained.processors.history import row_history
from constrained.processors.ngram_kernel import ban_repeated_ngrams_kernel
from constrained.processors.ngram_math import ban_tokens, repeated_ngram_bans
from constrained.processors.runners import Rows, triton_kernels_on
from constrained.processors.slots import Column

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class NoRepeatNGramProcessor(DualInterfaceProcessor):
    """No-repeat-ngram: ban every token that would complete an n-gram already in the output.

    With ``n = no_repeat_ngram_size``, at each step the last ``n - 1`` output tokens are a
    prefix; every token ``t`` such that ``prefix + [t]`` occurs as an n-gram among the last
    ``ngram_window`` output tokens (all of them by default) gets ``-inf``, except tokens in
    ``ngram_whitelist``. Output tokens only (not the prompt), as vLLM's DeepSeek-OCR
    ``NoRepeatNGramLogitsProcessor``, whose option names (``ngram_size``, ``window_size``,
    ``whitelist_token_ids``) are accepted too. Greedy requests are affected. A ban never
    leaves a row with no token at all (then that row keeps its banned tokens).

    Example::

        SamplingParams(temperature=0.0, extra_args={"no_repeat_ngram_size": 3})
    """

    OPTIONS = frozenset(
        {"no_repeat_ngram_size", "ngram_window", "ngram_whitelist", "penalize_structure"}
    )

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        self.history = row_history(self.slots, self.layout, "ngram_window", output_only=True)
        self.content = content_rows_for(self.layout, vllm_config)
        self.on_triton = triton_kernels_on(self.layout, on_v1=False)  # V2 only

    def columns(self) -> dict[str, Column]:
        return {
            "ngram_n": Column(torch.int64, 0),
            "ngram_window": Column(torch.int64, 0),  # 0: the whole output
            "ngram_whitelist": Column(torch.int64, -1, width=4),
            "ngram_spares": Column(torch.bool, False),  # penalize_structure off (content only)
        }

    def is_argmax_invariant(self) -> bool:
        return False

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if options.no_repeat_ngram_size is None:
            return False
        values: dict[str, Any] = {
            "ngram_n": options.no_repeat_ngram_size,
            "ngram_window": options.ngram_window or 0,
        }
        if options.ngram_whitelist:
            values["ngram_whitelist"] = sorted(set(options.ngram_whitelist))
        values["ngram_spares"] = options.spares_structure()
        self.slots.write(slot, **values)
        if tokens is not None:
            self.slots.payload[slot] = tokens  # V1: (prompt, vLLM's live output list)
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        spared = spared_rows(self.content, rows, self.slots.host_values["ngram_spares"])
        if self.on_triton:
            return self._apply_kernel(logits, rows, spared)
        max_n = int(self.slots.host_values["ngram_n"][self.slots.active].max(initial=0))
        history = self.history(rows)
        if history.shape[1] == 0:
            return logits
        banned = repeated_ngram_bans(
            history,
            self.slots.gather("ngram_n", rows),
            self.slots.gather("ngram_whitelist", rows),
            max_n,
        )
        if spared.size:  # structure rows of requests that spare it: no bans
            banned[torch.from_numpy(spared).to(banned.device)] = False
        return ban_tokens(logits, history, banned)

    def _apply_kernel(self, logits: torch.Tensor, rows: Rows, spared: np.ndarray) -> torch.Tensor:
        tables, states = self.slots.device_tables, self.layout.req_states
        return ban_repeated_ngrams_kernel(
            logits,
            rows.ctx,
            states.all_token_ids.gpu,
            states.prompt_len.gpu,
            tables["ngram_n"],
            tables["ngram_window"],
            tables["ngram_whitelist"],
            self.history.width(rows),
            row_flags(spared, rows.count, logits.device),
        )
