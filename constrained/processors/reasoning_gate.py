"""Think first, then answer constrained: where a request's constraint starts.

A request with ``reasoning_end`` decodes freely until its output's text contains the marker
(e.g. Qwen3's ``</think>``, one special token; a vocabulary without it spells it in pieces);
from the token after the one that completes it, its grammar applies. A token that would
complete it and carry more text (``>\\n\\n``, ``>{``) is banned while thinking: the answer is
exactly what the grammar allowed. ``max_reasoning_tokens`` forces the marker (its tokens)
once that many output tokens went by without it; finishing by ``max_tokens``
(``closing_plan.py``) forces it early enough to leave the answer its closing window. A prompt
whose text already ends with the marker, then whitespace (the chat template disabled
thinking: Qwen3 writes ``<think>\\n\\n</think>\\n\\n``) opens the gate before the first token.

Pure bookkeeping on token ids and their bytes (``grammars/marker.py``), no tensors:
``mask_fill.MaskWriter`` asks it per step whether a row is free, forced to a marker token, or
constrained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from constrained.grammars.marker import Marker


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
