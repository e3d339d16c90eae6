"""Think first, then answer constrained: where a request's constraint starts.

A request with ``reasoning_end`` decodes freely until its output's text contains the marker
(e.g. Qwen3's ``</think>``, one special token; a vocabulary without it spells it in pieces,
and a piece may carry more text, such as ``>\\n\\n``); from the token after the one that
completes it, its grammar applies. ``max_reasoning_tokens`` forces the marker (its tokens)
once that many output tokens went by without it; finishing by ``max_tokens``
(``closing_plan.py``) forces it early enough to leave the answer its closing window. A prompt
whose text already ends with the marker, then whitespace (the chat template disabled
thinking: Qwen3 writes ``<think>\\n\\n</think>\\n\\n``) opens the gate before the first token.

Pure bookkeeping on token ids and their bytes, no tensors: ``mask_fill.MaskWriter`` asks it
per step whether a row is free, forced to a marker token, or constrained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
        text, pieces = self.marker.text, self.marker.pieces
        for i, token in enumerate(new):
            self.seen += 1
            if self.forcing and self.forcing[0] == token:
                self.forcing.pop(0)
            else:
                self.forcing = []
            window = self.tail + pieces[token]
            if text in window:
                self.open = True
                return list(new[i + 1 :])
            self.tail = window[-(len(text) - 1) :] if len(text) > 1 else b""
        return None

    def forced_token(self) -> int | None:
        """The marker token this step must take, or ``None`` while thinking is free."""
        if self.force_after is None or self.seen < self.force_after:
            return None
        if not self.forcing:  # continue what the output already wrote of the marker
            self.forcing = list(self.marker.rest[self.matched()])
        return self.forcing[0]

    def matched(self) -> int:
        """How many of the marker's first bytes the output ends with."""
        text = self.marker.text
        for k in range(min(len(self.tail), len(text) - 1), 0, -1):
            if self.tail.endswith(text[:k]):
                return k
        return 0

    def copy(self) -> ReasoningGate:
        return ReasoningGate(
            self.marker, self.force_after, self.open, self.seen, self.tail, list(self.forcing)
        )


def prompt_closes_thinking(prompt_tail: Sequence[int], marker: Marker) -> bool:
    """Whether the prompt's text ends with the marker, then only whitespace."""
    text = b"".join(marker.pieces[t] for t in prompt_tail)
    return text.rstrip().endswith(marker.text)


def prompt_tail_size(marker: Marker) -> int:
    """Prompt tokens to look at: the marker's, and a few of whitespace after it."""
    return len(marker.ids) + 4


def marker_for(vocab: Vocab, text: str) -> Marker:
    """The marker as this vocabulary writes it (built once per text)."""

    def build() -> Marker:
        raw = text.encode()
        encode = vocab.hf_tokenizer.encode

        def ids(part: bytes) -> tuple[int, ...]:
            return tuple(encode(part.decode(errors="ignore"), add_special_tokens=False))

        rest = tuple(ids(raw[k:]) for k in range(len(raw)))
        return Marker(raw, rest[0], rest, text_pieces(vocab))

    return vocab._once(f"marker_{text}", build)


def text_pieces(vocab: Vocab) -> list[bytes]:
    """Each token id's text as bytes, special tokens (``</think>``) included."""

    def build() -> list[bytes]:
        pieces = list(vocab.token_bytes())
        for token_id, added in vocab.hf_tokenizer.added_tokens_decoder.items():
            if token_id < len(pieces):
                pieces[token_id] = added.content.encode()
        return pieces

    return vocab._once("text_pieces", build)
