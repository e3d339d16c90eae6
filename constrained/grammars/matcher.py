"""The matcher interface every backend adapter provides, and the end-of-sequence mask.

A matcher follows one request's output token by token and writes the next-token bitmask:
int32 words, bit ``i % 32`` of word ``i // 32`` set when token ``i`` is allowed (the layout
xgrammar and llguidance share).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


class Matcher(Protocol):
    """One request's grammar state."""

    #: Set when a refused token was consumed or the backend failed: the matcher is dead and
    #: allows only end-of-sequence from then on.
    error: str | None

    def consume(self, tokens: Sequence[int]) -> bool:
        """Advance over sampled tokens; False (and ``error`` set) when one is not allowed."""
        ...

    def try_consume(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; how many. Never sets ``error``."""
        ...

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (EOS only once complete)."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` consumed tokens (speculative drafts)."""
        ...

    def accepts_end(self) -> bool:
        """Whether the output so far is complete (end-of-sequence may come now)."""
        ...


def words_for(width: int) -> int:
    """Bitmask words for ``width`` logits."""
    return (width + 31) // 32


def fill_only(bitmask: torch.Tensor, row: int, token_ids: Sequence[int]) -> None:
    """Allow exactly ``token_ids`` in ``bitmask[row]``."""
    words = bitmask[row].numpy().view(np.uint32)  # shares memory; unsigned for bit 31
    words[:] = 0
    for token_id in token_ids:
        words[token_id // 32] |= np.uint32(1 << (token_id % 32))
