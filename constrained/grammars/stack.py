"""A request's grammar row as a stack of matchers (``matcher.py`` states the contract).

``build_stack`` builds it from the request's compile (a future: the engine loads compiled
grammars from the store in a worker thread), its budget and, when it thinks first, its
gate. Bottom to top:

1. the backend's matcher (llguidance, xgrammar, outlines-core), from the compiled grammar's
   ``matcher()``;
2. ``CheckedMatcher``: ``uniqueItems`` / ``contains`` (JSON schemas that use them; already
   over the backend's matcher: ``checked_matcher.CheckedGrammar.matcher()``);
3. ``ClosingMatcher``: every output complete by ``max_tokens`` (``close_at_max_tokens``);
4. ``GatedMatcher``: thinking first (``reasoning_end``, ``max_reasoning_tokens``;
   ``grammars/reasoning_gate.py``).

Layers 1-3 are the answer's (``AnswerLayers``). Without a gate they are built at once (the
compile awaited: the writer builds a stack at its request's first row, in V1's fill thread).
Under a gate they are built when first needed (the marker, a look-ahead past it, the budget's
walk), so the gate is built when its request joins and a thinking row waits for no compile.

The gate and the closing layer share the budget through ``AnswerLayers``: the gate walks the
answer's shortest completion below the closing layer once thinking nears ``max_tokens``
(``need``) to place its forced marker, and tells the closing layer how many output tokens
came before the answer's first (``start``: its ``spent``).

``build_stack`` returns a ``GrammarRow``: the stack (``matcher``, the contract of
``matcher.py``) and the gate's hooks for the writer (a thinking row is *free*: no mask, only
its bans; the prompt's end read before the first row). A request without a gate has none of
them to ask.

A row whose compile still runs at its first mask writes admission's row instead
(``start_row.py``); ``COMPILE_WAITS`` counts the rows that waited, and those that did not.

A grammar that fails to build gives a dead stack (``FailedMatcher``: only end-of-sequence),
never an exception to the engine. A new rule on grammar rows is one more ``MatcherWrapper``
placed here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from constrained.grammars.closing import find_witness
from constrained.grammars.closing_matcher import ClosingMatcher, closing_layer
from constrained.grammars.matcher import Matcher, fill_only
from constrained.grammars.reasoning_gate import GatedMatcher

if TYPE_CHECKING:
    import torch

    from constrained.grammars.reasoning_gate import Thinking
    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)


class CompileWaits:
    """How often, and how long in all, rows' stacks waited for their compile in this process:
    the answer's first mask needs its grammar, and a compile still running holds the fill
    (vLLM keeps such a request out of the batch; a logits processor cannot hold one row).
    The seconds bound how long steps were held: V1's fill runs beside the forward pass.
    ``started``: rows whose first row was admission's instead (``StartRow``; their stack,
    built at the next row, may still wait, counted then). Reported by the engine's state
    snapshot (``processors/stats.py``)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.started = 0
        self._lock = threading.Lock()  # (the fill threads of several engines in one process)

    def result(self, compiled: Any) -> Any:
        """``compiled.result()``, the wait counted when there is one."""
        if compiled.done():
            return compiled.result()
        start = time.perf_counter()
        try:
            return compiled.result()
        finally:
            waited = time.perf_counter() - start
            with self._lock:
                self.count += 1
                self.seconds += waited

    def start(self) -> None:
        """A row took admission's first row instead of waiting."""
        with self._lock:
            self.started += 1


COMPILE_WAITS = CompileWaits()


def build_stack(
    compiled: Any,
    vocab: Vocab,
    limit: int | None,
    hints: Sequence[list[int]] = (),
    scratch: torch.Tensor | None = None,
    thinking: Thinking | None = None,
    kind: str = "grammar",
) -> GrammarRow:
    """The stack for one request: ``compiled``, the future of its compiled grammar;
    ``limit``: its ``max_tokens`` when it closes by them; ``hints``: completions a preempted
    request's earlier stack knew (checked before use); ``scratch``: a host bitmask row for
    closing's walks; ``thinking``: its gate, if it thinks first; ``kind``: the spec's (the log;
    closing walks a JSON schema's grammar as JSON)."""
    answer = AnswerLayers(compiled, vocab, limit, hints, scratch, kind)
    if thinking is None:
        return GrammarRow(answer.matcher())
    gated = GatedMatcher(answer, thinking, limit)
    return GrammarRow(gated, gated)


@dataclass
class GrammarRow:
    """A request's row as the writer drives it: the stack (``matcher``) and, when the request
    thinks first, its gate (the stack's top), which alone knows these:

    - ``free()``: this step's row is free, every token allowed but ``bans()``: the writer
      writes and applies no mask for it, only its bans (one indexed write for all free
      rows), so a thinking row costs what an unconstrained request's costs. Asked once the
      step's tokens are consumed (look-aheads included); it may do the row's work (the gate
      places its forced marker near the budget).
    - ``bans()``: the tokens a free row must not take.
    - ``stays_free()``: a guess made before the next tokens come: the row after one more
      token will be free and cost no grammar work (no compile to wait for, no walk). V1
      then follows a batch of such rows inline instead of in its fill thread.
    - ``reads_prompt()`` and ``read_prompt(tail)``: how many of the prompt's last tokens
      the gate must read before its first row (``0``: none, or read already), and reading
      them (once; the runner gives them when it has them: V1 when the request joins, V2 in
      the step's one device-to-host copy).
    """

    matcher: Matcher
    gate: GatedMatcher | None = None

    def free(self) -> bool:
        return self.gate is not None and self.gate.free()

    def bans(self) -> list[int]:
        return self.gate.bans() if self.gate is not None else []

    def stays_free(self) -> bool:
        return self.gate is not None and self.gate.stays_free()

    def reads_prompt(self) -> int:
        return self.gate.reads_prompt() if self.gate is not None else 0

    def read_prompt(self, tail: Sequence[int]) -> None:
        if self.gate is not None:
            self.gate.read_prompt(tail)


class AnswerLayers:
    """The answer's layers (backend, array checks, closing), built on first ``matcher()``."""

    def __init__(
        self,
        compiled: Any,
        vocab: Vocab,
        limit: int | None,
        hints: Sequence[list[int]],
        scratch: torch.Tensor | None,
        kind: str,
    ) -> None:
        self.compiled = compiled
        self.vocab = vocab
        self.limit = limit
        self.hints = list(hints)
        self.scratch = scratch
        self.kind = kind
        self.stack: Matcher | None = None
        self.closing: ClosingMatcher | None = None
        self.failed = False
        self.spent = 0  # output tokens before the answer's first (a thinking block)

    def matcher(self) -> Matcher:
        if self.stack is None:
            try:
                self.stack = self._build()
            except Exception as exc:  # admission compiled it; never take the engine down
                logger.error(
                    "constrained: %s compile failed in the engine (%s); the request is "
                    "allowed only end-of-sequence",
                    self.kind,
                    exc,
                )
                self.failed = True
                self.stack = FailedMatcher(str(exc) or "compile failed", self.vocab.eos_token_id)
        return self.stack

    def _build(self) -> Matcher:
        grammar = COMPILE_WAITS.result(self.compiled)
        if self.limit is None:
            return grammar.matcher()
        json = self.kind == "json_schema"  # (its walks: ``ClosingMatcher.json``)
        self.closing = closing_layer(
            grammar, self.vocab, self.limit, self.hints, self.scratch, json=json
        )
        self.closing.spent = self.spent
        return self.closing

    def need(self) -> int | None:
        """Tokens of a completion from the answer's start, walked below the closing layer
        (``limit`` when none is found within it); ``None`` if its grammar failed."""
        stack = self.matcher()
        if self.failed or self.limit is None:
            return None
        below = self.closing.inner if self.closing is not None else stack
        witness = find_witness(below, self.vocab, self.limit, self.scratch)
        return len(witness) if witness is not None else self.limit

    def start(self, spent: int) -> None:
        """The output had ``spent`` tokens before the answer's first: closing counts them."""
        self.spent = spent
        if self.closing is not None:
            self.closing.spent = spent


class FailedMatcher(Matcher):
    """A stack whose grammar failed to build: dead from the start, only end-of-sequence."""

    def __init__(self, error: str, eos: int) -> None:
        self.error = error
        self.eos = eos

    def consume(self, tokens: Sequence[int]) -> bool:
        return False

    def try_consume(self, tokens: Sequence[int]) -> int:
        return 0

    def rollback(self, num_tokens: int) -> None:
        """Nothing was consumed."""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        fill_only(bitmask, row, [self.eos])

    def accepts_end(self) -> bool:
        return False
