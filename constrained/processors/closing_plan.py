"""Budget-aware closing: one constrained request's plan to finish by its ``max_tokens``.

While a request has room, its mask is the grammar's, unchanged. The plan keeps a *witness*:
tokens that complete the output from where it is (``grammars/closing.py``); ``need`` is its
length. Once ``left <= 2 * need + SLACK`` (``left``: the tokens the request may still emit,
end-of-sequence included) the request is *closing*: its row allows only tokens checked to
keep a completion in what is left: the witness's next token, the model's most likely
allowed token when a walk of its own finishes in time, and up to ``KEEP`` more of the
model's ``CANDIDATES`` likeliest that finish with a suffix already known. Each allowed
token's suffix is remembered, so the next step starts from a known witness. So from the
first closing step on, ``need + 1 <= left`` holds at every step and the output ends,
complete, by ``max_tokens``.

What is not guaranteed: before the window opens the model is free, and a token that raises
the shortest completion by more than ``SLACK + need`` tokens at once (it opens a long
required value) can leave too little room; then, or when no walk finds a completion, the
request runs on with the grammar's mask and is cut at ``max_tokens`` as before, and the
engine logs a warning for it, once.
docs/budget.md has the cost and the measured rates.

Example (what ``mask_fill.MaskWriter`` does per step)::

    plan = ClosingPlan(limit=params.max_tokens)
    plan.after_tokens(matcher, vocab, new_tokens, consumed)   # in the mask fill
    if plan.closing:
        row_allows = plan.restrict(matcher, vocab, top_ids, allowed, consumed)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from vllm.logger import init_logger

from constrained.grammars.closing import completes, find_witness, keeps_completion

logger = init_logger(__name__)

if TYPE_CHECKING:
    import torch

    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab

SLACK = 32  # closing starts when left <= 2 * need + SLACK
RECHECK_EVERY = 16  # before that, refresh the witness at most this often
CANDIDATES = 32  # the model's most likely tokens looked at per closing step
KEEP = 8  # at most this many allowed per closing step (each check consumes a suffix)


@dataclass
class ClosingPlan:
    """The witness and state of one request that must finish within ``limit`` tokens."""

    limit: int  # max_tokens: output tokens, end-of-sequence included
    witness: list[int] | None = None
    need: int = 0  # length of the last witness found
    closing: bool = False
    unreachable: bool = False  # no witness found at the last look: cannot close (yet)
    safe: dict[int, list[int]] = field(default_factory=dict)  # last closing row's tokens
    next_check: int = 0
    # Suffixes that completed the output before a preemption (``PlanShelf``): tried, and
    # checked by the matcher, before a fresh walk, which may find only longer ones.
    hints: list[list[int]] = field(default_factory=list)
    warned: bool = False  # the warning that it will be cut was logged

    def left(self, consumed: int) -> int:
        return self.limit - consumed

    def near(self, consumed: int) -> bool:
        """Whether the request may be closing at ``consumed`` (by its last known need)."""
        return self.left(consumed) <= 2 * self.need + SLACK

    def after_tokens(
        self,
        matcher: Matcher,
        vocab: Vocab,
        new: Sequence[int],
        consumed: int,
        scratch: torch.Tensor | None = None,
    ) -> None:
        """Follow ``new`` tokens (the matcher has consumed them) and decide ``closing``.

        ``scratch``: a host bitmask row for the witness walk."""
        left = self.left(consumed)
        witness = self._follow(matcher, list(new))
        if self.hints and (witness is None or len(witness) + 1 > left):
            witness = self._from_hints(matcher, left) or witness
        if witness is not None and len(witness) + 1 > left:  # a walk may find a shorter one
            witness = find_witness(matcher, vocab, left - 1, scratch) or witness
        self.closing = False
        if witness is None:
            if not self.near(consumed) and consumed < self.next_check:
                return
            witness = find_witness(matcher, vocab, max(left - 1, 0), scratch)
            self.unreachable = witness is None
            if witness is None:
                self.next_check = consumed + RECHECK_EVERY
                self._warn_cut(left, None)
                return
        self.witness, self.need = witness, len(witness)
        self.closing = self.near(consumed)
        if len(witness) + 1 > left:
            self._warn_cut(left, len(witness) + 1)
        # Look again halfway to the window (at least RECHECK_EVERY tokens on): a long budget
        # costs a few walks, not one every few tokens.
        distance = left - (2 * self.need + SLACK)
        self.next_check = consumed + max(RECHECK_EVERY, distance // 2)

    def _warn_cut(self, left: int, needed: int | None) -> None:
        """Say once, in the engine's log, that this request may be cut at ``max_tokens``."""
        if self.warned or not self.near(self.limit - left):
            return
        self.warned = True
        found = f"needs {needed} tokens" if needed is not None else "none"
        logger.warning(
            "constrained: no completion of an output found within max_tokens=%d (%d tokens "
            "left; the shortest found: %s): it may be cut at max_tokens (docs/budget.md, "
            "where closing cannot apply)",
            self.limit,
            left,
            found,
        )

    def _from_hints(self, matcher: Matcher, left: int) -> list[int] | None:
        """The shortest hint that completes the output and fits. Hints are kept: vLLM may
        replay a resumed request's output over several steps (V2 chunked prefill), and the
        hint that fits is the one for the state the old plan last saw."""
        for suffix in sorted(self.hints, key=len):
            if len(suffix) + 1 <= left and completes(matcher, suffix):
                return list(suffix)
        return None

    def suffixes(self) -> list[list[int]]:
        """Every completion this plan knows (its witness, and its closing row's suffixes)."""
        known = list(self.safe.values())
        return [self.witness, *known] if self.witness is not None else known

    def _follow(self, matcher: Matcher, new: list[int]) -> list[int] | None:
        """The witness after ``new``, when a known one still holds (cheap: no mask).

        The first new token may be one the last closing row checked (its suffix was kept);
        the rest (accepted drafts) must follow that suffix, or the old witness must still
        complete the output (a character inside a string)."""
        witness, safe = self.witness, self.safe
        self.witness, self.safe = None, {}
        if witness is None or not new:
            return witness
        start, rest = (safe[new[0]], new[1:]) if new[0] in safe else (witness, new)
        if rest == start[: len(rest)]:
            return start[len(rest) :]
        for suffix in sorted((start, witness), key=len):
            if completes(matcher, suffix):
                return suffix
        return None

    def restrict(
        self,
        matcher: Matcher,
        vocab: Vocab,
        candidates: Sequence[int],
        allowed: np.ndarray,
        consumed: int,
        scratch: torch.Tensor | None = None,
    ) -> list[int]:
        """The tokens a closing row allows: each keeps a completion within what is left.

        ``candidates``: the model's likeliest tokens, best first; ``allowed``: the grammar's
        row."""
        left, eos = self.left(consumed), vocab.eos_token_id
        witness = self.witness or []
        safe: dict[int, list[int]] = {witness[0]: witness[1:]} if witness else {}
        if matcher.accepts_end():
            safe[eos] = []
        suffixes = ([], witness[1:], witness) if witness else ([],)
        walked = False
        for token in candidates:
            if len(safe) >= KEEP:
                break
            if token in safe or token == eos or not allowed[token]:
                continue
            suffix = keeps_completion(matcher, token, suffixes, left)
            if suffix is None and not walked:  # the model's favourite gets a walk of its own
                walked = True
                suffix = self._walk_after(matcher, vocab, token, left, scratch)
            if suffix is not None:
                safe[token] = suffix
        self.safe = safe
        return list(safe)

    @staticmethod
    def _walk_after(
        matcher: Matcher, vocab: Vocab, token: int, left: int, scratch: torch.Tensor | None
    ) -> list[int] | None:
        """A witness after ``token`` that fits (token, witness, end-of-sequence) in ``left``."""
        if left < 2 or matcher.try_consume([token]) != 1:
            return None
        try:
            return find_witness(matcher, vocab, left - 2, scratch)
        finally:
            matcher.rollback(1)

    def draft_allows(self, drafts: Sequence[int], eos: int) -> list[int] | None:
        """A closing request's draft row: what follows the checked path, or ``None`` when the
        drafts leave it (the main row never allows them, so the target rejects this row's
        sample; the caller writes the grammar's row).

        No drafts (placeholders): the main row's tokens. Drafts along a checked path: the one
        token its suffix takes next (end-of-sequence once complete).
        """
        if not drafts:
            return list(self.safe)
        if drafts[0] not in self.safe:
            return None
        suffix = self.safe[drafts[0]]
        for token in drafts[1:]:
            if not suffix or token != suffix[0]:
                return None
            suffix = suffix[1:]
        return [suffix[0]] if suffix else [eos]


class PlanShelf:
    """Plans by request, so a preempted request resumes with what its plan knew.

    vLLM re-adds a preempted request (V1 and V2) with its same ``SamplingParams`` object and
    the output so far; its new plan starts from the old plan's suffixes (``hints``), each
    checked by the matcher before use, so a wrong match (``n > 1`` siblings share one
    unseeded params object) costs a check, never soundness. Bounded: oldest first out.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._plans: dict[int, tuple[object, list[ClosingPlan]]] = {}

    def plan_for(self, params: object, limit: int) -> ClosingPlan:
        """A new plan for ``params``, with the hints of earlier plans of the same params."""
        plan = ClosingPlan(limit)
        held = self._plans.pop(id(params), None)
        earlier = held[1] if held is not None and held[0] is params else []
        for old in earlier:  # and every tail: drafts may have taken a suffix's first tokens
            for suffix in old.suffixes():
                plan.hints.extend(suffix[k:] for k in range(len(suffix) + 1))
        self._plans[id(params)] = (params, [*earlier[-3:], plan])
        while len(self._plans) > self.size:
            del self._plans[next(iter(self._plans))]
        return plan
