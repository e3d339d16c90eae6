"""Think first, then answer constrained: the reasoning gate, the top layer of a thinking
request's grammar row.

A request with ``reasoning_end`` decodes freely until its output writes the marker; from the
token after the one that completes it, its grammar applies. A marker that is one added token
(Qwen3's ``</think>``) is that token only, as vLLM's reasoning parsers see it
(``end_token_id``): the same text spelled in pieces stays thinking, and forcing writes the
token. Any other marker is text, matched across token boundaries (a vocabulary without
``</think>`` spells it in pieces). A token that would
complete it and carry more text (``>\\n\\n``, ``>{``) is banned while thinking: the answer is
exactly what the grammar allowed. ``max_reasoning_tokens`` forces the marker (its tokens)
once that many output tokens went by without it; finishing by ``max_tokens``
(``closing_matcher.py``) forces it early enough to leave the answer its closing window. A
prompt whose text already ends with the marker, then whitespace (the chat template disabled
thinking: Qwen3 writes ``<think>\\n\\n</think>\\n\\n``) opens the gate before the first token.

``GatedMatcher`` is that rule as a layer of the matcher contract (``grammars/matcher.py``),
on top of the answer's stack (``grammars/stack.py`` builds both), in three phases:

- **thinking, free**: ``free()``; the row is every token but ``bans()`` (end-of-sequence, the
  reasoning parser's implicit ends, the request's own stop tokens, the tokens that would
  spill text past the marker), so the writer writes and applies no mask for it, only its
  bans. The layers below are not built for it: a thinking row waits for no compile;
- **thinking, forced**: the marker's next token is the only one (``forced()``); the gate
  writes that row alone (it is its own ``bottom``);
- **open**: every call goes to the answer's stack, told how many output tokens came before
  its first (``Answer.start``: closing's budget counts them).

While thinking the gate follows any token (its bans are rules of its rows; a look-ahead past
a banned token is a draft the verifier rejects); its state before each thinking token is kept,
so a look-ahead (drafts) rolls back like any layer's, across the marker too.

The budget: when thinking comes within ``answer_room(MAX_WITNESS_TOKENS)`` of ``max_tokens``,
a committed row walks once for the answer's shortest completion from its start
(``Answer.need``) and the marker is forced no later than that completion's room before
``max_tokens`` (``answer_room``): the closing layer then has its window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from constrained.grammars.closing import MAX_WITNESS_TOKENS
from constrained.grammars.marker import Marker
from constrained.grammars.matcher import Matcher, MatcherWrapper, fill_only

if TYPE_CHECKING:
    import torch

MAX_ROLLBACK = 512  # thinking tokens whose gate state is kept for rollbacks
GateState = tuple[bool, int, bytes, tuple[int, ...]]  # open, seen, tail, forcing


@dataclass
class ReasoningGate:
    """One request's thinking phase: open once the marker has appeared in the output.

    Example (a marker spelled ``</``, ``think``, ``>``; forced after 3 free tokens)::

        gate = ReasoningGate(marker, force_after=3)
        gate.feed(ids("Hmm </"))   # None: still thinking ("</" may start the marker)
        gate.forced_token()        # None: 2 tokens so far
        gate.feed(ids(" so"))      # None
        gate.forced_token()        # the id of "</": three tokens without the marker
        gate.feed(ids("</think"))
        gate.forced_token()        # the id of ">"
        gate.feed(ids('>{"a"'))    # ids('{"a"'): open; the constraint takes the rest
    """

    marker: Marker
    force_after: int | None = None  # output tokens before the marker is forced (None: never)
    open: bool = False
    seen: int = 0  # output tokens looked at
    tail: bytes = b""  # the output's last bytes (fewer than the marker's)
    forcing: list[int] = field(default_factory=list)  # marker tokens still to force

    def feed(self, new: Sequence[int]) -> list[int] | None:
        """Look at the output's ``new`` tokens; once the marker completes the gate opens and
        the tokens after it (for the constraint) are returned, else ``None``."""
        for i, token in enumerate(new):
            if self.step(token):
                return list(new[i + 1 :])
        return None

    def step(self, token: int) -> bool:
        """Look at one more output token; whether it completed the marker (the gate opens)."""
        text = self.marker.text
        self.seen += 1
        if self.forcing and self.forcing[0] == token:
            self.forcing.pop(0)
        else:
            self.forcing = []
        if self.marker.token is not None:  # one added token: only it ends thinking
            self.open = token == self.marker.token
            return self.open
        window = self.tail + self.marker.pieces[token]
        if text in window:
            self.open = True
            return True
        self.tail = window[-(len(text) - 1) :] if len(text) > 1 else b""
        return False

    def forced_token(self) -> int | None:
        """The marker token this step must take, or ``None`` while thinking is free."""
        if self.force_after is None or self.seen < self.force_after:
            return None
        if not self.forcing:  # continue what the output already wrote of the marker
            self.forcing = list(self.marker.rest[self.matched()])
        return self.forcing[0]

    def spills(self) -> list[int]:
        """Tokens this step must not take while thinking: they would complete the marker and
        carry text past it, text the constraint would never see (``>{`` after ``</think``)."""
        text, spills = self.marker.text, self.marker.spills
        banned = list(spills[0])  # empty for a marker that is one special token
        if not self.tail or text[0] not in self.tail:
            return banned  # nothing of the marker written yet
        for k in range(1, len(self.tail) + 1):
            if spills[k] and self.tail.endswith(text[:k]):
                banned.extend(spills[k])
        return banned

    def matched(self) -> int:
        """How many of the marker's first bytes the output ends with."""
        text = self.marker.text
        for k in range(min(len(self.tail), len(text) - 1), 0, -1):
            if self.tail.endswith(text[:k]):
                return k
        return 0

    def state(self) -> GateState:
        """What a token changes (for ``restore``; ``force_after`` is the request's)."""
        return self.open, self.seen, self.tail, tuple(self.forcing)

    def restore(self, state: GateState) -> None:
        self.open, self.seen, self.tail, forcing = state
        self.forcing = list(forcing)

    def copy(self) -> ReasoningGate:
        return ReasoningGate(
            self.marker, self.force_after, self.open, self.seen, self.tail, list(self.forcing)
        )


@dataclass(frozen=True)
class Thinking:
    """What a request's gate is built from (``stack.build_stack``)."""

    marker: Marker
    force_after: int | None  # max_reasoning_tokens (None: never forced but by the budget)
    #: Banned on every thinking row, besides the spilling tokens: end-of-sequence, the
    #: reasoning parser's implicit ends, the request's own stop tokens (not the marker's).
    stops: tuple[int, ...]


class Answer(Protocol):
    """The layers below the gate, as ``stack.build_stack`` hands them over."""

    def matcher(self) -> Matcher:
        """The answer's stack, built on first call (waits for the compile)."""
        ...

    def need(self) -> int | None:
        """Tokens of a completion of the answer from its start (below the closing layer; the
        budget when none is found in it), or ``None`` when its grammar failed to build."""
        ...

    def start(self, spent: int) -> None:
        """The output had ``spent`` tokens before the answer's first (closing's budget)."""
        ...


def answer_room(need: int) -> int:
    """Tokens a thinking request's answer is left before ``max_tokens`` when the marker is
    forced: room to close without narrowing most of its rows (twice its need, plus 32)."""
    return 2 * need + 32


class GatedMatcher(MatcherWrapper):
    """The answer's stack behind the reasoning gate (see the module docstring).

    Example (a toy answer below; ``</think>`` one token, id 9)::

        stack = GatedMatcher(answer, Thinking(marker, force_after=None, stops=(eos,)))
        stack.read_prompt(prompt[-stack.reads_prompt():])   # (``stack.GrammarRow`` asks)
        stack.consume([5, 7])   # thinking
        stack.free(), stack.bans()          # True, [eos]
        stack.consume([9, 3])   # the marker, then the answer's first token (to its stack)
        stack.free()                        # False: the answer's row, filled as any stack's
    """

    def __init__(self, answer: Answer, thinking: Thinking, limit: int | None = None) -> None:
        # No ``super().__init__``: ``inner`` is built when first needed.
        self.answer = answer
        self.gate = ReasoningGate(thinking.marker, thinking.force_after)
        self.stops = list(thinking.stops)
        self.limit = limit  # max_tokens when the request closes by them
        self.budgeted = limit is None  # the forced marker placed for the budget
        self.pending = True  # the prompt's end not read yet (``read_prompt``)
        self.ahead = 0  # look-ahead tokens since the last ``consume``
        self.after = 0  # tokens the answer's stack took since the gate opened
        # The gate's state before each of the last thinking tokens, for ``rollback``.
        self.history: deque[GateState] = deque(maxlen=MAX_ROLLBACK)
        self._inner: Matcher | None = None

    @property
    def inner(self) -> Matcher:  # type: ignore[override]
        if self._inner is None:
            self._inner = self.answer.matcher()
        return self._inner

    @property
    def error(self) -> str | None:  # type: ignore[override]
        if self._error is not None:
            return self._error
        return self.inner.error if self.gate.open else None  # thinking never fails

    @error.setter
    def error(self, value: str | None) -> None:
        self._error = value

    # -- following the output -------------------------------------------------------------

    def _think(self, tokens: list[int]) -> list[int]:
        """Feed ``tokens`` to the gate; the ones after the marker (all once it is open)."""
        gate = self.gate
        if gate.open:
            return tokens
        for i, token in enumerate(tokens):
            self.history.append(gate.state())
            if gate.step(token):
                self.answer.start(gate.seen)
                return tokens[i + 1 :]
        return []

    def consume(self, tokens: Sequence[int]) -> bool:
        self.ahead = 0
        after = self._think(list(tokens))
        if not after:
            return self.error is None
        self.after += len(after)
        return self.inner.consume(after) and self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        if self.error is not None:
            return 0
        tokens = list(tokens)
        after = self._think(tokens)
        taken = len(tokens) - len(after)  # the gate takes any thinking token
        if after:
            answered = self.inner.try_consume(after)
            self.after += answered
            taken += answered
        self.ahead += taken
        return taken

    def rollback(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        answered = min(num_tokens, self.after)
        if answered:
            self.inner.rollback(answered)
            self.after -= answered
        own = num_tokens - answered
        if own:
            if own > len(self.history):
                raise ValueError(f"rollback past the gate's last {len(self.history)} tokens")
            self.gate.restore(self.history[-own])
            for _ in range(own):
                self.history.pop()
        self.ahead = max(self.ahead - num_tokens, 0)

    def accepts_end(self) -> bool:
        return self.gate.open and self.error is None and self.inner.accepts_end()

    # -- the prompt -----------------------------------------------------------------------

    def reads_prompt(self) -> int:
        return prompt_tail_size(self.gate.marker) if self.pending else 0

    def read_prompt(self, tail: Sequence[int]) -> None:
        """Open the gate when the prompt already closed the thinking block."""
        self.pending = False
        if not self.gate.open and prompt_closes_thinking(tail, self.gate.marker):
            self.gate.open = True
            self.answer.start(self.gate.seen)

    # -- the row --------------------------------------------------------------------------

    def _forced_token(self) -> int | None:
        """The marker token this row must take (``None``: a free row). A committed row near
        the budget first places the forced marker (once)."""
        gate = self.gate
        committed = not self.pending and not self.ahead
        if not self.budgeted and committed and gate.seen >= self.walk_at():
            self._budget()
        return gate.forced_token()

    def walk_at(self) -> int:
        """Output tokens after which a thinking request with a budget walks for its answer's
        witness (to place the forced marker): a witness is at most MAX_WITNESS_TOKENS long."""
        assert self.limit is not None
        return self.limit - len(self.gate.marker.ids) - answer_room(MAX_WITNESS_TOKENS)

    def _budget(self) -> None:
        """Force the marker early enough that the answer has its room left (``answer_room``)
        before ``max_tokens``."""
        self.budgeted = True
        need = self.answer.need()
        if need is None or self.limit is None:
            return
        gate = self.gate
        latest = max(self.limit - len(gate.marker.ids) - answer_room(need), 0)
        gate.force_after = latest if gate.force_after is None else min(gate.force_after, latest)

    def free(self) -> bool:
        return not self.gate.open and self._forced_token() is None

    def bans(self) -> list[int]:
        return [*self.stops, *self.gate.spills()] if not self.gate.open else []

    def stays_free(self) -> bool:
        gate = self.gate
        return (
            not gate.open
            and not self.pending
            and (gate.force_after is None or gate.seen + 1 < gate.force_after)
            and (self.limit is None or gate.seen + 1 < self.walk_at())
        )

    def forced(self) -> list[int]:
        if self.gate.open:
            return self.inner.forced() if self.error is None else []
        return list(self.gate.forcing) if self._forced_token() is not None else []

    def forced_bytes(self) -> bytes | None:
        if self.gate.open:
            return self.inner.forced_bytes() if self.error is None else b""
        pieces = self.gate.marker.pieces
        return b"".join(pieces[t] for t in self.forced())

    @property
    def bottom(self) -> Matcher:
        return self.inner.bottom if self.gate.open else self  # thinking: its own row

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.gate.open:
            self.inner.fill(bitmask, row)
            return
        forced = self._forced_token()
        if forced is not None:
            fill_only(bitmask, row, [forced])
            return
        words = bitmask[row].numpy().view(np.uint32)  # a free row: every token but the bans
        words[:] = np.uint32(0xFFFFFFFF)
        ids = np.asarray(self.bans(), dtype=np.int64)
        np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))

    def narrow(self, bitmask: torch.Tensor, row: int) -> None:
        if self.gate.open:
            self.inner.narrow(bitmask, row)

    def suffixes(self) -> list[list[int]]:
        return self._inner.suffixes() if self._inner is not None else []


def prompt_closes_thinking(prompt_tail: Sequence[int], marker: Marker) -> bool:
    """Whether the prompt's text ends with the marker, then only whitespace."""
    text = b"".join(marker.pieces[t] for t in prompt_tail)
    return text.rstrip().endswith(marker.text)


def prompt_tail_size(marker: Marker) -> int:
    """Prompt tokens to look at: the marker's, and a few of whitespace after it."""
    return len(marker.ids) + 4
