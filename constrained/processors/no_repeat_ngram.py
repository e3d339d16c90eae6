"""``no_repeat_ngram_size``: never repeat an n-gram of the output (as the OCR models' processors).

The math is ``ngram_math``; this module gathers each logits row's recent output tokens, in a
``[rows, width]`` history, from where each runner keeps them (chosen once, at build):

- Model Runner V1: the request's live output list on the host (the last ``width`` tokens of
  each row that uses the option, copied into one array, one upload per step).
- Model Runner V2: ``req_states.all_token_ids`` on the device for committed tokens, and
  ``ctx.input_ids`` for the draft tokens before a speculative row; gathered by device ops,
  no host reads. A ``-1`` placeholder draft is no token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import DualInterfaceProcessor, Tokens
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

    # ---- each runner's history -----------------------------------------------------------

    def _v1_history(self, rows: Rows) -> torch.Tensor:
        """The last tokens of each row's output list (rows without the option: none)."""
        slots = np.flatnonzero(self.slots.active[: rows.count])
        windows = self.slots.host_values["ngram_window"]
        outputs = self.slots.payload
        spans = []
        for slot in slots.tolist():  # V1's outputs are host lists: read per row
            size = len(outputs[slot])
            window = int(windows[slot])
            spans.append(min(size, window) if window else size)
        width = max(spans, default=0)
        history = np.full((rows.count, width), -1, dtype=np.int64)
        for slot, span in zip(slots.tolist(), spans, strict=True):
            if span:
                history[slot, width - span :] = outputs[slot][-span:]
        return torch.from_numpy(history).to(self.layout.device, non_blocking=True)

    def _v2_history(self, rows: Rows) -> torch.Tensor:
        """Each row's visible output tokens: committed ones from ``all_token_ids``, then the
        drafts fed before it (``ctx.input_ids``), right-aligned; ``-1`` elsewhere."""
        ctx, states = rows.ctx, self.layout.req_states
        width = self._v2_width(ctx)
        slots = rows.slots.long()
        all_tokens = states.all_token_ids.gpu
        prompt_len = states.prompt_len.gpu[slots].long().unsqueeze(1)
        pos = ctx.pos.long().unsqueeze(1)
        local = ctx.expanded_local_pos.long().unsqueeze(1)
        visible = (pos + 1 - prompt_len).clamp_(min=0)  # output tokens before the sample
        window = self.slots.gather("ngram_window", rows).unsqueeze(1)
        span = torch.where(window > 0, torch.minimum(window, visible), visible)
        index = torch.arange(width, device=slots.device).unsqueeze(0) - width + visible
        position = prompt_len + index  # absolute position of each history entry
        committed = all_tokens[slots.unsqueeze(1), position.clamp(0, all_tokens.shape[1] - 1)]
        back = pos - position  # rows back from this one, for the drafts
        row = torch.arange(rows.count, device=slots.device).unsqueeze(1)
        drafts = ctx.input_ids[(row - back).clamp(0, rows.count - 1)]
        tokens = torch.where(position <= pos - local, committed.long(), drafts.long())
        return torch.where(index >= visible - span, tokens, -1)

    def _v2_width(self, ctx: Any) -> int:
        """A host bound on any row's history: the widest window of this step's requests,
        capped by the most output tokens a row can see (host values, no sync)."""
        slots = ctx.idx_mapping_np
        states = self.layout.req_states
        seen = ctx.seq_lens_upper_bound_np - states.prompt_len.np[slots]
        windows = self.slots.host_values["ngram_window"][slots]
        used = self.slots.active[slots]
        limit = np.where(windows > 0, np.minimum(windows, seen), seen)[used]
        return int(max(limit.max(initial=0), 0))
