"""The text that ends a model's thinking (``reasoning_end``), as this vocabulary writes it.

Bytes of every token (special tokens included: Qwen3's ``</think>`` is one token), and the
marker's token ids from any point of it, for ``grammars/reasoning_gate.py`` to follow and
force, and for admission to count; and the tokens that would complete it carrying more text
(``>{``), which thinking must not write: that text would reach the answer unchecked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from constrained.grammars.vocab import Vocab


@dataclass(frozen=True)
class Marker:
    """The text that ends thinking, as bytes, and how to write it from any point."""

    text: bytes
    ids: tuple[int, ...]  # the marker's tokens, as the model writes it alone
    rest: tuple[tuple[int, ...], ...]  # rest[k]: tokens for text[k:] (k bytes already out)
    pieces: Sequence[bytes]  # every token id's text (special tokens included)
    #: The marker's id when it is one added token (Qwen3's ``</think>``): then only that
    #: token ends thinking, as vLLM's reasoning parsers see it (``end_token_id``); the same
    #: text spelled in pieces is thinking text.
    token: int | None = None

    @cached_property
    def spills(self) -> tuple[tuple[int, ...], ...]:
        """spills[k]: tokens that, after an output ending with text[:k], complete the marker
        and carry text past it (k = 0: the whole marker inside one token, with text after
        it). Built on first use, by the engine's mask fill (admission needs only ``ids``).
        Empty for a one-token marker: no other token completes it."""
        if self.token is not None:
            return tuple(() for _ in self.text)
        return spill_ids(self.text, self.pieces)


def marker_for(vocab: Vocab, text: str) -> Marker:
    """The marker as this vocabulary writes it (built once per text)."""

    def build() -> Marker:
        raw = text.encode()
        encode = vocab.tokenizer.encode

        def ids(part: bytes) -> tuple[int, ...]:
            return tuple(encode(part.decode(errors="ignore"), add_special_tokens=False))

        rest = tuple(ids(raw[k:]) for k in range(len(raw)))
        added = vocab.tokenizer.added_tokens_decoder
        token = rest[0][0] if len(rest[0]) == 1 and rest[0][0] in added else None
        return Marker(raw, rest[0], rest, text_pieces(vocab), token)

    return vocab._once(f"marker_{text}", build)


def text_pieces(vocab: Vocab) -> list[bytes]:
    """Each token id's text as bytes, special tokens (``</think>``) included."""

    def build() -> list[bytes]:
        pieces = list(vocab.token_bytes())
        for token_id, added in vocab.tokenizer.added_tokens_decoder.items():
            if token_id < len(pieces):
                pieces[token_id] = added.content.encode()
        return pieces

    return vocab._once("text_pieces", build)


def spill_ids(text: bytes, pieces: Sequence[bytes]) -> tuple[tuple[int, ...], ...]:
    """For each k, the tokens that complete ``text`` after its first k bytes and carry more
    bytes after it (one pass over the vocabulary, once per marker)."""
    n = len(text)
    spills: list[list[int]] = [[] for _ in text]
    firsts = set(text[1:])
    for token, piece in enumerate(pieces):
        if not piece:
            continue
        at = piece.find(text)
        if at >= 0 and at + n < len(piece):
            spills[0].append(token)
        if piece[0] in firsts:
            # text[k:] must be shorter than the piece: k > n - len(piece)
            for k in range(max(1, n - len(piece) + 1), n):
                if piece.startswith(text[k:]):
                    spills[k].append(token)
    return tuple(tuple(ids) for ids in spills)
