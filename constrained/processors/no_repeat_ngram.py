"""``no_repeat_ngram_size``: never repeat an n-gram of the output (as the OCR models' processors).

The math is ``ngram_math``; each row's recent output tokens come from ``history`` (host lists
under Model Runner V1, device tables under V2, chosen once at build).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
from constrained.processors.history import device_history, device_width, host_history
from constrained.processors.ngram_math import ban_tokens, repeated_ngram_bans
from constrained.processors.runners import Rows
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

    OPTIONS = frozenset({"no_repeat_ngram_size", "ngram_window", "ngram_whitelist"})

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        self.history = self.layout.pick(self._v1_history, self._v2_history)

    def columns(self) -> dict[str, Column]:
        return {
            "ngram_n": Column(torch.int64, 0),
            "ngram_window": Column(torch.int64, 0),  # 0: the whole output
            "ngram_whitelist": Column(torch.int64, -1, width=4),
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
        self.slots.write(slot, **values)
        if tokens is not None:
            self.slots.payload[slot] = tokens[1]  # V1: vLLM's live output list
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
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
        return ban_tokens(logits, history, banned)

    # ---- each runner's history (``history.py``) -------------------------------------------

    def _v1_history(self, rows: Rows) -> torch.Tensor:
        """The last tokens of each using row's output list (V1's host lists)."""
        slots = np.flatnonzero(self.slots.active[: rows.count]).tolist()
        windows = self.slots.host_values["ngram_window"]
        outputs = [(self.slots.payload[slot],) for slot in slots]
        spans = [
            min(len(out[0]), int(windows[s])) if windows[s] else len(out[0])
            for s, out in zip(slots, outputs, strict=True)
        ]
        history = host_history(rows.count, slots, outputs, spans)
        return torch.from_numpy(history).to(self.layout.device, non_blocking=True)

    def _v2_history(self, rows: Rows) -> torch.Tensor:
        """Each row's visible output tokens (committed, then drafts), on the device."""
        ctx, states = rows.ctx, self.layout.req_states
        slots_np = ctx.idx_mapping_np
        width = device_width(
            ctx,
            states.prompt_len.np[slots_np],
            self.slots.host_values["ngram_window"][slots_np],
            self.slots.active[slots_np],
        )
        first = states.prompt_len.gpu[rows.slots].long()  # output tokens only
        span = self.slots.gather("ngram_window", rows)
        return device_history(ctx, states.all_token_ids.gpu, rows.slots, first, span, width)
