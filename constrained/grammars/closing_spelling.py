"""A witness as text (``closing_matcher.py``): its bytes and token bounds, the tails a
check's walk may end on, the rest of its text after a token that writes its first bytes,
and text spelt as the tokenizer writes it.

One ``Spelling`` per request: it keeps the answers for the last witness it was asked about
(a sort asks for every token it checks, with one witness).

Example::

    spelling = Spelling(vocab)
    rest = spelling.aligned(token, witness)  # '",' against '"' ',"b":0}': ',"b":0}' as tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from constrained.grammars.token_shapes import hex_finish, owed_hex_digits, prefix_tokens

if TYPE_CHECKING:
    from constrained.grammars.vocab import Vocab

JOIN_TAILS = 12  # the witness's boundary tails a check's walk may end on (the shortest)
_BOUNDARY = (b",", b"}", b"]")  # the witness's bytes that begin a tail to join


def masks_taken(found: list[int], joins: Sequence[list[int]]) -> int:
    """The masks a walk that ended on one of ``joins`` took: ``found`` less the join it
    ends with (the longest that matches; at least one)."""
    tail = max((len(j) for j in joins if j and found[-len(j) :] == j), default=0)
    return max(len(found) - tail, 1)


def text_and_bounds(pieces: Sequence[bytes], tokens: Sequence[int]) -> tuple[bytes, dict[int, int]]:
    """The tokens' text and their bounds in it: byte offset -> the fewest tokens before
    it (a token that writes no bytes starts at the bound it shares)."""
    text, bounds = b"", {0: 0}
    for k, token in enumerate(tokens, start=1):
        text += pieces[token]
        bounds.setdefault(len(text), k)
    return text, bounds


def special_texts(vocab: Vocab) -> dict[int, bytes]:
    """The text each special token of the tokenizer's added ones stands for
    (``<tool_call>``), by id: its bytes are none (``Vocab.token_bytes``)."""

    def build() -> dict[int, bytes]:
        added = vocab.tokenizer.added_tokens_decoder
        pieces = vocab.token_bytes()
        return {
            token: added[token].content.encode()
            for token in vocab.special_ids()
            if token in added and token < len(pieces) and not pieces[token]
        }

    return vocab._once("closing_special_texts", build)


class Spelling:
    """A request's witnesses as text (the vocabulary's bytes), the last one's kept."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._text: tuple | None = None  # ``text_of``'s last answer
        self._joins: tuple | None = None  # ``joins``'s last answer

    def text_of(self, witness: list[int]) -> tuple[bytes, dict[int, int]]:
        """The witness's text and its tokens' bounds in it (byte offset -> tokens before;
        the fewest, so a tail from a bound keeps a token that writes no bytes, a special
        token's end), kept for the last witness: a sort asks for every token it checks."""
        kept = self._text
        if kept is not None and kept[0] is witness and kept[1] == len(witness):
            return kept[2], kept[3]
        text, bounds = text_and_bounds(self.vocab.token_bytes(), witness)
        self._text = (witness, len(witness), text, bounds)
        return text, bounds

    def rest(
        self, tokens: Sequence[int], text: bytes, bounds: dict[int, int], at: int
    ) -> list[int] | None:
        """``tokens``' text (``text``, ``bounds``: ``text_and_bounds``) from byte ``at`` on,
        as the tokenizer writes it, with each token that writes no bytes kept where it
        stands (a special token that ends a structural tag: the text alone would lose it);
        ``None`` where the text does not decode."""
        pieces = self.vocab.token_bytes()
        # the bound where the tokens after the one ``at`` falls inside begin (in text order)
        end = at if at in bounds else next(bound for bound in bounds if bound > at)
        spelt: list[int] = []
        start = at
        for token in tokens[bounds[end] :]:
            if pieces[token]:
                end += len(pieces[token])
                continue
            head = self.spelt(text[start:end]) if end > start else []
            if head is None:
                return None
            spelt += [*head, token]
            start = end
        head = self.spelt(text[start:]) if len(text) > start else []
        return None if head is None else [*spelt, *head]

    def joins(self, witness: list[int]) -> list[list[int]]:
        """What a check's walk tries to end on at every state it reaches: the witness, its
        tail after its first token, and its tails from each member or item boundary (a
        token of the witness that begins with ``,`` ``}`` ``]``): after ``":-`` the walk
        takes ``1`` and the rest of the object is the witness's own (one mask, not 70).
        Such a byte inside a token (the ``,`` of ``},"`` or ``","``) starts a tail too, its
        text as the tokenizer writes it (``rest``): a walk that took ``]}`` goes on with
        ``,"`` and the rest (the last ``JOIN_TAILS`` of each kind)."""
        kept = self._joins
        if kept is not None and kept[0] is witness and kept[1] == len(witness):
            return kept[2]
        pieces = self.vocab.token_bytes()
        heads = [k for k in range(2, len(witness)) if pieces[witness[k]][:1] in _BOUNDARY]
        joins = [witness, witness[1:], *(witness[k:] for k in heads[-JOIN_TAILS:])]
        text, bounds = self.text_of(witness)
        first = len(pieces[witness[0]]) if witness else 0
        inside = [  # boundaries inside a token (after the first): their tails as text
            at
            for at in range(first + 1, len(text))
            if text[at : at + 1] in _BOUNDARY and at not in bounds
        ]
        for at in inside[-JOIN_TAILS:]:
            tail = self.rest(witness, text, bounds, at)
            if tail is not None:
                joins.append(tail)
        self._joins = (witness, len(witness), joins)
        return joins

    def aligned(self, token: int, witness: list[int]) -> list[int] | None:
        """The witness's text after the token's, when the token writes the witness's first
        bytes (``",`` against ``"`` ``,"b":0}``): the rest, as the witness's own tokens where
        the token ends on one of their bounds, else as the tokenizer writes it (``rest``)."""
        return self.aligned_text(self.vocab.token_bytes()[token], witness)

    def aligned_text(self, piece: bytes, witness: list[int]) -> list[int] | None:
        """``aligned`` for the text ``piece`` (one token's, or a run of them). A witness
        that begins with a special token a grammar may also take as text (a hermes tag's
        ``<tool_call>``, which a model may write ``<`` ``tool`` ``_call`` ``>``) aligns on
        that text too: its rest, then the witness after the special token (a suffix to
        check, never one taken unchecked: ``aligned_bytes`` does not cross it)."""
        if not piece or not witness:
            return None
        text, bounds = self.text_of(witness)
        if not text.startswith(piece):
            spoken = special_texts(self.vocab).get(witness[0], b"")
            if len(spoken) <= len(piece) or not spoken.startswith(piece):
                return None  # (all of it: the witness's tail, which callers try anyway)
            head = self.spelt(spoken[len(piece) :])
            return None if head is None else [*head, *witness[1:]]
        if len(piece) in bounds:
            return witness[bounds[len(piece)] :]
        return self.rest(witness, text, bounds, len(piece))

    def aligned_bytes(self, piece: bytes, witness: list[int]) -> list[int] | None:
        """A completion after a token that writes ``piece``, found without a check where
        ``piece`` writes the witness's first bytes: the witness's tokens from the first of
        their bounds at or after its end, after the bytes up to that bound as the tokenizer
        writes them (a matcher reads bytes: the witness's text completes however tokens
        split it). ``None`` where ``piece`` does not begin the witness's text, or passes a
        token that writes no bytes (a special token: no text stands for it), or the bytes
        up to the bound do not decode (it ends inside a character)."""
        if not piece or not witness:
            return None
        text, bounds = self.text_of(witness)
        if not text.startswith(piece):
            return None
        at = len(piece)
        end = at if at in bounds else next(bound for bound in bounds if bound > at)
        pieces = self.vocab.token_bytes()
        if not all(pieces[token] for token in witness[: bounds[end]]):
            return None
        head = self.spelt(text[at:end]) if end > at else []
        if head is None or any(token >= len(pieces) for token in head):
            return None  # (an id past the model's width)
        if b"".join(pieces[token] for token in head) != text[at:end]:
            return None  # (a tokenizer that adds a space before a word writes other bytes)
        return [*head, *witness[bounds[end] :]]

    def spelt(self, text: bytes) -> list[int] | None:
        """``text`` as the tokenizer writes it; ``None`` where it does not decode (it
        starts or ends inside a UTF-8 character)."""
        try:
            return self.vocab.encode(text.decode())
        except UnicodeDecodeError:
            return None

    def leads(self, witness: list[int]) -> set[int]:
        """Tokens whose bytes begin the witness's text (``</`` and ``</param`` for a
        witness ``</`` ``parameter`` ``>``...)."""
        pieces = self.vocab.token_bytes()
        return prefix_tokens(self.vocab, b"".join(pieces[token] for token in witness[:8]), 48)

    def escape_finish(self, tokens: list[int]) -> tuple[int, ...]:
        """The hex digits a ``\\u`` escape the output (``tokens``) ends inside still owes
        (``ace`` after ``#\\`` ``uD``: no one token's finish, ``token_finish``), as the
        fewest tokens that write them; none where the output does not end inside one."""
        pieces = self.vocab.token_bytes()
        tail = b"".join(pieces[t] for t in tokens[-8:])[-16:]
        if b"\\u" not in tail:
            return ()
        return hex_finish(self.vocab, owed_hex_digits(tail))
