"""The matcher contract: what every layer of a grammar row promises, and the bitmask helpers.

A request's grammar row is a **stack of matchers**: a backend's matcher at the bottom
(llguidance, xgrammar, outlines-core), then wrappers that each add one rule on top of the
row below (``CheckedMatcher``: ``uniqueItems`` / ``contains``; ``ClosingMatcher``: finish by
``max_tokens``; ``GatedMatcher``, always on top: think first, ``reasoning_end``).
``grammars/stack.py`` builds a request's stack. Every layer speaks this contract, so the code
that drives a row (``processors/mask_fill.py``) never asks which backend or wrapper it holds.

Bitmask layout: int32 words, bit ``i % 32`` of word ``i // 32`` set when token ``i`` is
allowed (the layout xgrammar and llguidance share).

The core (every layer):

- ``consume(tokens) -> bool``: advance over sampled tokens. A refused token sets ``error``
  and returns False; from then on ``fill`` allows only end-of-sequence.
- ``try_consume(tokens) -> int``: consume the longest allowed prefix; how many. Never sets
  ``error``. Used by look-aheads, which undo it with ``rollback``.
- ``rollback(n)``: undo the last ``n`` consumed tokens (drafts, look-aheads). After it the
  layer is exactly as before those tokens: no state of a look-ahead survives.
- ``fill(bitmask, row)``: write the allowed next tokens into ``bitmask[row]``: exactly the
  tokens whose ``try_consume`` would succeed and after which the output can still be
  completed under every layer's rules; end-of-sequence only when ``accepts_end``. (One
  exception: the gate, while thinking, follows any token; its rows' bans keep the sampler
  off the tokens it must not take, and a look-ahead past one is a draft the verifier
  rejects.)
- ``accepts_end() -> bool``: the output so far is complete and valid (end-of-sequence may
  come now). A layer never allows end-of-sequence otherwise: a ``stop`` is a promise.

The optional hooks (defaults here; a layer overrides what it knows):

- ``completes(tokens) -> bool``: whether ``tokens`` are all consumed and leave the output
  complete (``accepts_end``), the matcher unchanged: ``try_consume``, ``accepts_end`` and
  ``rollback`` by default; a backend with a cheaper exact check overrides it (llguidance
  validates the tokens and end-of-sequence without committing them). Closing's checks.
- ``accepted(tokens) -> int``: how many of ``tokens``, in order, would be consumed from
  here, the matcher unchanged: ``try_consume`` and ``rollback`` by default; llguidance
  validates them without committing. Closing's walks (a token, then ``"``).
- ``forced() -> list[int]``: tokens the grammar forces next, fewest first (``[]``: none
  known). Taking them is always allowed; look-aheads use them to skip mask fills.
- ``forced_bytes() -> bytes | None``: the bytes forced next whichever tokens write them;
  ``None`` when the backend cannot say (``b""``: it can, and none are forced).
- ``narrow(bitmask, row)``: after the bottom matcher wrote ``row`` (possibly in a batched
  fill of many rows, ``fill_many``), clear what the wrappers refuse, innermost first.
  ``fill`` is ``bottom.fill`` followed by ``narrow``.
- ``bottom``: the matcher whose fill writes the row before the layers above it narrow it:
  the backend's matcher at the bottom of the stack (whose type's ``fill_many`` writes many
  rows at once), or a layer that writes this step's row alone (the gate while thinking: its
  forced marker token).
- ``fill_many(pairs, bitmask)`` (classmethod of a bottom matcher): write each
  ``(matcher, row)``'s row; llguidance does it in its thread pool, xgrammar in one call of its
  ``BatchGrammarMatcher``.
- ``suffixes() -> list[list[int]]``: completions the stack knows from its state (closing's
  witnesses), kept for the same request's next stack when vLLM preempts it
  (``build_stack``'s ``hints``).
- ``reads_bytes``: whether the stack takes the same text however tokens split it (no rule
  counts tokens, refuses a token by its id or holds forced text to one spelling; special
  tokens aside, which write no text): closing then knows a completion after a token that
  writes the witness's first bytes without a check (``Spelling.aligned_bytes``). ``False``
  by default; xgrammar's matchers, unless a rule counts tokens or excludes one.

The reasoning gate's hooks for the writer (``free``, ``bans``, ``stays_free``,
``reads_prompt``, ``read_prompt``) are not the contract's: ``stack.GrammarRow`` holds them,
for the one request that has a gate.

A wrapper (``MatcherWrapper``) holds ``inner`` and forwards the core to it (and
``suffixes``); it overrides ``_narrow_own`` (its clearing)
and whichever core calls it must follow (``consume``, ``rollback``... for its own state). A
new rule on a grammar row is one wrapper and its tests; ``grammars/stack.py`` builds a
request's stack.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


class Matcher(ABC):
    """One request's grammar state (see the module docstring for the contract): the five
    core methods are abstract, the hooks have defaults."""

    #: Set when a refused token was consumed or the layer failed: the matcher is dead and
    #: allows only end-of-sequence from then on.
    error: str | None = None

    @abstractmethod
    def consume(self, tokens: Sequence[int]) -> bool: ...

    @abstractmethod
    def try_consume(self, tokens: Sequence[int]) -> int: ...

    @abstractmethod
    def rollback(self, num_tokens: int) -> None: ...

    @abstractmethod
    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...

    @abstractmethod
    def accepts_end(self) -> bool: ...

    # -- optional hooks ---------------------------------------------------------------

    def completes(self, tokens: Sequence[int]) -> bool:
        accepted = self.try_consume(tokens)
        try:
            return accepted == len(tokens) and self.accepts_end()
        finally:
            self.rollback(accepted)

    def accepted(self, tokens: Sequence[int]) -> int:
        taken = self.try_consume(tokens)
        self.rollback(taken)
        return taken

    def forced(self) -> list[int]:
        return []

    def forced_bytes(self) -> bytes | None:
        return None

    def narrow(self, bitmask: torch.Tensor, row: int) -> None:
        """A bottom matcher refuses nothing beyond its own fill."""
        return None

    @property
    def bottom(self) -> Matcher:
        return self

    @classmethod
    def fill_many(cls, pairs: Sequence[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        for matcher, row in pairs:
            matcher.fill(bitmask, row)

    def suffixes(self) -> list[list[int]]:
        return []

    reads_bytes: bool = False


class MatcherWrapper(Matcher):
    """A layer over ``inner``: forwards the core, adds its own clearing (``_narrow_own``)."""

    def __init__(self, inner: Matcher) -> None:
        self.inner = inner

    @property
    def error(self) -> str | None:  # type: ignore[override]
        return self._error if self._error is not None else self.inner.error

    @error.setter
    def error(self, value: str | None) -> None:
        self._error = value

    _error: str | None = None

    def consume(self, tokens: Sequence[int]) -> bool:
        return self.inner.consume(tokens) and self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        return self.inner.try_consume(tokens) if self.error is None else 0

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)

    def accepts_end(self) -> bool:
        return self.error is None and self.inner.accepts_end()

    def forced(self) -> list[int]:
        return self.inner.forced() if self.error is None else []

    def forced_bytes(self) -> bytes | None:
        return self.inner.forced_bytes() if self.error is None else b""

    @property
    def bottom(self) -> Matcher:
        return self.inner.bottom

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.bottom.fill(bitmask, row)
        self.narrow(bitmask, row)

    def narrow(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.narrow(bitmask, row)
        self._narrow_own(bitmask, row)

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        """This layer's clearing of ``bitmask[row]`` (the layers below have written it)."""

    def suffixes(self) -> list[list[int]]:
        return self.inner.suffixes()

    @property
    def reads_bytes(self) -> bool:  # type: ignore[override]
        """A layer's own rules read bytes (numbers, array items): as the layers below."""
        return self.inner.reads_bytes


def words_for(width: int) -> int:
    """Bitmask words for ``width`` logits."""
    return (width + 31) // 32


def row_ids(words: np.ndarray) -> np.ndarray:
    """The token ids (int64, ascending) whose bits are set in a row's uint32 ``words``: read
    from its nonzero words only: about 16 us for a row of a few words, where unpacking and
    reading all 151,936 bits took about 70 in closing's riser rows."""
    hit = (words != 0).nonzero()[0]  # a bool array's nonzero: 3x a uint32 array's
    if not hit.size:
        return hit
    bits = np.unpackbits(words[hit].view(np.uint8), bitorder="little").reshape(-1, 32)
    word, bit = bits.nonzero()
    return hit[word] * 32 + bit


def fill_only(bitmask: torch.Tensor, row: int, token_ids: Sequence[int]) -> None:
    """Allow exactly ``token_ids`` in ``bitmask[row]``."""
    words = bitmask[row].numpy().view(np.uint32)  # shares memory; unsigned for bit 31
    words[:] = 0
    for token_id in token_ids:
        words[token_id // 32] |= np.uint32(1 << (token_id % 32))
