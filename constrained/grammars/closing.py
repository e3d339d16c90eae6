"""Finishing inside a token budget: a complete output we can reach, and tokens that keep one.

No backend says how many tokens its constraint still needs (llguidance, xgrammar and
outlines-core expose the next-token mask, forced tokens and rollback, not a distance), so we
find a *witness*: a concrete token sequence that completes the output from the matcher's
state, found by walking the matcher's own masks and taking, at each step, the allowed token
that best closes what is open (``"``, ``}``, ``]``, then short complete values such as ``0``,
``""``, ``[]``, then separators, then single characters; a token already used in the walk is
taken later, so a walk does not circle; where the matcher knows the tokens the grammar
forces next, llguidance's fast-forward tokens, it takes those). Its length is an upper
bound of the tokens needed: the guarantee rests only on checks the matcher itself makes (the
witness is consumed and ``accepts_end`` holds), never on the ranking.

A token ``t`` *keeps a completion* with ``r`` tokens left (end-of-sequence included) when
``t`` followed by a known suffix is consumed and complete in ``r - 1`` tokens
(``keeps_completion``). docs/budget.md describes how the grammar processor uses both.

Example::

    witness = find_witness(matcher, vocab, limit=64)    # e.g. ids of '"', '}' : 2 tokens
    suffix = keeps_completion(matcher, token, [witness[1:], witness], room=10)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from constrained.grammars.matcher import row_ids, words_for
from constrained.grammars.qwen_xml import PARAMETER_CLOSE
from constrained.grammars.token_shapes import piece_arrays
from constrained.schema.piece_arrays import byte_set

if TYPE_CHECKING:
    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab

# Witness walks stop here: a walk costs one mask per token, so it is bounded even when the
# budget is not (a constraint that needs more is refused at admission or left unclosed).
MAX_WITNESS_TOKENS = 256
ROOT_WITNESS_TOKENS = 256  # a root witness looks this far (admission's limit too)
_NEVER = np.int32(1 << 30)  # rank of tokens a witness never uses (special, empty)
_CLOSER = 10  # ranks up to this close a string, object or array
_LOOKAHEAD = 128  # tokens tried for "can the string close after it" inside a string
_LOOKAHEAD_MISSES = 8  # lookaheads in a row that found none: then one every this many
# steps (a ``pattern`` like ``^a|deny$`` after other text closes after no one token; each
# lookahead is up to 256 checks, and a walk that finds nothing took 114 of them, 76 ms)
_REUSE_COST = 16  # added to a token's rank each time the walk has used it
_LITERAL = 20  # rank of JSON's short complete values
_MULTI_BYTE = 150  # ranks from here: tokens of several bytes (by length)
_LITERAL_COST = 100  # their extra cost in a ``plain_text`` walk


def _rank(piece: bytes, closers_first: bool) -> int:
    """How well a token finishes an output; lower is better.

    Two orders, tried in turn: ``closers_first`` (close strings, objects and arrays as soon
    as the grammar lets them, with the shortest values), and one for string content that a
    ``pattern`` or ``format`` shapes (a ``}`` is valid inside an e-mail address, and taking it
    first would never reach the ``@``).
    """
    if not piece or b"\\" in piece:  # a backslash only starts escapes: never needed
        return int(_NEVER)
    if not piece.strip(b'"]}'):  # (strip: at C speed, for each of a vocabulary's pieces)
        if not piece.strip(b'"'):
            return 0
        return _CLOSER - len(piece) if closers_first else 70  # '"}}' closes three things at once
    if piece in (b'""', b"[]", b"{}", b"null", b"true", b"false"):
        return _LITERAL
    if len(piece) == 1:
        char = chr(piece[0])
        if char in ",:":
            return 30
        if char in "0123456789":
            # '1' first, '0' last: a closed date is 1234-05-16, never year 0000, which
            # RFC 3339 allows but Python's date (and so pydantic, jsonschema) refuses
            return 40 + (int(char) - 1) % 10
        if char.isascii() and char.isalpha():
            return (50 if char.islower() else 60) + ord(char.lower()) - ord("a")
        if char.isascii() and not char.isspace():
            return 49 if closers_first else 25  # '@', '.', '-': what patterns ask for
        return 120  # whitespace and non-ASCII bytes: only when nothing else fits
    return _MULTI_BYTE + len(piece)


_BACKSLASH = byte_set(b"\\")
_CLOSERS = byte_set(b'"]}')
_LITERAL_BYTES = byte_set(b'"[]{}' + b"nulltruefalse")


def token_ranks(vocab: Vocab, closers_first: bool = True) -> np.ndarray:
    """Each token id's finishing rank in one of the two orders (built once per vocabulary)."""

    def build() -> np.ndarray:
        # A piece of two or more bytes ranks by its length unless it has a backslash, is
        # only closers or is a short literal: those few go through ``_rank`` one by one.
        pieces, arrays = vocab.token_bytes(), piece_arrays(vocab)
        ranks = (_MULTI_BYTE + arrays.lengths).astype(np.int32)
        short = arrays.lengths <= 1
        special = arrays.any_in(_BACKSLASH) | arrays.all_in(_CLOSERS)
        literal = (arrays.lengths <= 5) & arrays.all_in(_LITERAL_BYTES)
        for token in np.flatnonzero(short | special | literal).tolist():
            ranks[token] = _rank(pieces[token], closers_first)
        ranks[vocab.eos_token_id] = _NEVER
        return ranks

    return vocab._once(f"closing_ranks_{closers_first}", build)


def literal_tokens(vocab: Vocab) -> np.ndarray:
    """Which token ids are JSON's short complete values (``true``, ``null``, ``[]``...)."""
    return vocab._once("closing_literals", lambda: token_ranks(vocab, True) == _LITERAL)


def allowed_ids(bitmask_row: torch.Tensor, width: int) -> np.ndarray:
    """The allowed-token booleans of one int32 bitmask row."""
    words = bitmask_row.numpy().view(np.uint8)
    return np.unpackbits(words, bitorder="little")[:width].astype(bool)


def find_witness(
    matcher: Matcher,
    vocab: Vocab,
    limit: int,
    scratch: torch.Tensor | None = None,
    plain_text: bool = False,
    joins: Sequence[Sequence[int]] = (),
) -> list[int] | None:
    """Tokens (end-of-sequence not included) that complete the output from ``matcher``'s
    state, at most ``limit`` of them; ``None`` when the walk finds none in time.

    The matcher is left where it was (every consumed token is rolled back). ``scratch``: a
    host int32 bitmask row to fill (one is made if not given). ``plain_text``: rank JSON's
    literals (``true``, ``null``...) like any other word (a regex's ``[a-z]+``). ``joins``:
    known completions (a caller's witness) tried at every state the walk reaches, the
    shortest first: the walk ends as soon as one completes in time (after ``\\`` the walk
    takes ``n``, then the witness closes the string: a walk of one mask, not ten).
    The walk takes one character at a time where the tokenizer writes several, so it may run
    to twice ``limit`` and still fit once spelt (``shortest_spelling``). Inside a string it
    looks ahead for a token the string can close after (``_closing_next``) at each of its
    first ``_LOOKAHEAD_MISSES`` steps, then at one in that many while none is found.
    """
    wanted = min(limit, MAX_WITNESS_TOKENS)
    walk = _Walk(
        matcher, vocab, min(2 * wanted + 4, MAX_WITNESS_TOKENS), scratch, plain_text, joins
    )
    path = walk.run()
    if path is None:
        return None
    path = shortest_spelling(matcher, vocab, path)
    return path if len(path) <= wanted else None


class _Walk:
    """One ``find_witness`` walk: from the matcher's state, a token at a time, the best
    finisher its mask allows (rank in ``token_ranks``' order for the state: structure or a
    string's content, plus ``_REUSE_COST`` each time the walk has taken it), the grammar's
    forced tokens first, a caller's completion as soon as one fits."""

    def __init__(
        self,
        matcher: Matcher,
        vocab: Vocab,
        limit: int,
        scratch: torch.Tensor | None,
        plain_text: bool,
        joins: Sequence[Sequence[int]],
    ) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self.limit = limit  # tokens as the walk takes them
        self.orders = orders = (token_ranks(vocab, True), token_ranks(vocab, False))
        self.quote = vocab._once("closing_quote", lambda: int(orders[0].argmin()))  # '"': first
        self.closers = closing_sequences(vocab)
        # What each token costs more once used (a fresh zeroed array is cheaper than a copy)
        self.used = _literal_costs(vocab).copy() if plain_text else np.zeros(vocab.width, np.int32)
        if scratch is None:
            scratch = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
        self.scratch = scratch
        self.words = scratch[0].numpy().view(np.uint32)  # the row each step's mask is written to
        self.joins = sorted((list(j) for j in joins if j), key=len)
        self.path: list[int] = []
        self.misses = 0  # lookaheads in a row that found no token the string closes after

    def run(self) -> list[int] | None:
        """The walk's tokens, or ``None`` (no completion within ``limit``, or no token to
        take); the matcher is left where it was."""
        matcher, path = self.matcher, self.path
        try:
            while not matcher.accepts_end():
                if len(path) >= self.limit:
                    return None
                rest = self._joined() if path else None  # the caller's completions, from here
                if rest is not None:
                    return path + rest
                if self._took_forced():
                    continue
                matcher.fill(self.scratch, 0)
                few = _few_allowed(self.words, self.vocab.width)
                if few is not None:  # structure (keys, punctuation): the few allowed tokens only
                    token = self._structure_token(few)
                    if token is None or not self._take(token, self.orders[0]):
                        return None
                elif not self._wide_step():
                    return None
            return path
        finally:
            matcher.rollback(len(path))

    def _joined(self) -> list[int] | None:
        """The shortest of the caller's completions that completes from here in time."""
        path, limit, matcher = self.path, self.limit, self.matcher
        return next(
            (j for j in self.joins if len(path) + len(j) <= limit and matcher.completes(j)), None
        )

    def _took_forced(self) -> bool:
        """Whether the walk took tokens the grammar forces next."""
        ahead = self.matcher.forced()[: self.limit - len(self.path)]
        if not ahead:
            return False
        taken = self.matcher.try_consume(ahead)
        self.path.extend(ahead[:taken])
        return taken > 0

    def _structure_token(self, few: np.ndarray) -> int | None:
        """The cheapest of a narrow row's allowed tokens (``few``) in the closers-first
        order; ``None`` if none or only never-used ones."""
        costs = self.orders[0][few] + self.used[few]
        token = int(few[costs.argmin()]) if few.size else -1
        return None if token < 0 or self.orders[0][token] >= _NEVER else token

    def _wide_step(self) -> bool:
        """One step in a row allowing most of the vocabulary (inside a string, where the
        content order works): close raw text or the string if the grammar lets it, else
        take the cheapest token, one the string can close after first. False: none."""
        matcher, path, words = self.matcher, self.path, self.words
        in_string = int(np.bitwise_count(words).sum()) > self.vocab.width // 4
        if in_string and len(path) + 1 < self.limit:  # raw text (Qwen's XML): close it now
            closer = next((c for c in self.closers if completes_prefix(matcher, c)), None)
            if closer is not None and len(path) + len(closer) <= self.limit:
                matcher.try_consume(closer)
                path.extend(closer)
                return True
        # '"' closes the string: ranked first, and no pass over the row is needed
        quote = self.quote
        quoted = in_string and words[quote >> 5] >> np.uint32(quote & 31) & 1
        if quoted and matcher.try_consume([quote]) == 1:
            path.append(quote)
            return True
        ranks = self.orders[int(in_string)]
        token, closes = self._cheapest(in_string, ranks)
        if token is None:
            return False
        if in_string:
            self.misses = 0 if closes else self.misses + 1
        return self._take(token, ranks)

    def _cheapest(self, in_string: bool, ranks: np.ndarray) -> tuple[int | None, bool]:
        """The token a wide row's step takes (``None``: no token to take), and whether the
        lookahead found it (the string can close after it)."""
        misses, quote = self.misses, self.quote
        look = in_string and (misses < _LOOKAHEAD_MISSES or misses % _LOOKAHEAD_MISSES == 0)
        cheap, cheap_cost = _allowed_cheap(self.vocab, int(in_string), self.used, self.words)
        if cheap.size >= _LOOKAHEAD:  # the cheapest tokens all ranked single bytes: no
            # pass over the vocabulary (the same choice as the whole row's)
            token = _closing_next(self.matcher, cheap, cheap_cost, quote) if look else None
            if token is not None:
                return token, True
            return int(cheap[cheap_cost.argmin()]), False
        allowed = allowed_ids(self.scratch[0], self.vocab.width)
        cost = np.where(allowed, ranks + self.used, _NEVER)
        token = None
        if look:  # the lookahead's tokens: a pass over the vocabulary only then
            few = np.argpartition(cost, _LOOKAHEAD)[:_LOOKAHEAD]
            token = _closing_next(self.matcher, few, cost[few], quote)
        closes = token is not None
        if token is None:
            token = int(cost.argmin())
        if not allowed[token] or ranks[token] >= _NEVER:
            return None, closes
        return token, closes

    def _take(self, token: int, ranks: np.ndarray) -> bool:
        """Consume ``token`` onto the path (False if the matcher refuses it); taking it
        again costs more unless it closes something."""
        if self.matcher.try_consume([token]) != 1:
            return False
        self.path.append(token)
        if ranks[token] > _CLOSER:  # closing never circles; anything else may
            self.used[token] += _REUSE_COST
        return True


def _literal_costs(vocab: Vocab) -> np.ndarray:
    """A walk's starting costs in a regex or grammar (``plain_text``, not JSON): JSON's
    literals cost more there, being no shortcut."""

    def build() -> np.ndarray:
        used = np.zeros(vocab.width, dtype=np.int32)
        used[token_ranks(vocab, True) == _LITERAL] = _LITERAL_COST
        return used

    return vocab._once("closing_literal_costs", build)


def shortest_spelling(matcher: Matcher, vocab: Vocab, path: list[int]) -> list[int]:
    """``path``, or its text as the tokenizer writes it when that is shorter and also
    completes from ``matcher``'s state (a walk takes ``"`` ``,`` ``"`` one by one where the
    tokenizer writes ``","``: the need it measures halves)."""
    if len(path) < 2:
        return path
    pieces = vocab.token_bytes()
    for kept in range(min(4, len(path) - 1)):  # tokens that end a UTF-8 character: kept
        try:
            text = b"".join(pieces[token] for token in path[kept:]).decode()
        except UnicodeDecodeError:
            continue
        tokens = path[:kept] + vocab.encode(text)
        if len(tokens) < len(path) and matcher.completes(tokens):
            return tokens
        break
    return path


def _few_allowed(words: np.ndarray, width: int) -> np.ndarray | None:
    """The allowed token ids, ascending, of a row (its uint32 words) that allows at most a
    quarter of the vocabulary by its nonzero words alone (``None`` otherwise:
    ``find_witness`` then reads the whole row). The same choice as the whole row's
    ``argmin``, without a pass over it."""
    if np.count_nonzero(words) * 32 > width // 4:  # counted first: a wide row needs no ids
        return None
    ids = row_ids(words)
    return ids[ids < width]


def closing_sequences(vocab: Vocab) -> list[list[int]]:
    """Token ids of the texts that close raw text: a Qwen XML parameter's value
    (``qwen_xml.PARAMETER_CLOSE``). A JSON string's ``"`` is ranked first already."""

    def build() -> list[list[int]]:
        encode = vocab.tokenizer.encode
        return [list(encode(text, add_special_tokens=False)) for text in (PARAMETER_CLOSE,)]

    return vocab._once("closing_sequences", build)


def completes_prefix(matcher: Matcher, tokens: Sequence[int]) -> bool:
    """Whether every one of ``tokens`` is allowed in turn (matcher unchanged)."""
    accepted = matcher.try_consume(tokens)
    matcher.rollback(accepted)
    return accepted == len(tokens)


def _closing_next(matcher: Matcher, tokens: np.ndarray, cost: np.ndarray, quote: int) -> int | None:
    """Inside a string: the cheapest of the ``_LOOKAHEAD`` cheapest of ``tokens`` (their
    ``cost``) after which the string can close (``"``) or the output is complete (a
    ``pattern`` like ``[a-z]x`` needs the right character before the quote; ranks alone
    would try every other first)."""
    if tokens.size >= _LOOKAHEAD:
        part = np.argpartition(cost, _LOOKAHEAD - 1)[:_LOOKAHEAD]
        tokens, cost = tokens[part], cost[part]
    order = np.argsort(cost, kind="stable")
    for token, rank in zip(tokens[order].tolist(), cost[order].tolist(), strict=True):
        if rank >= _NEVER or token == quote:
            break
        taken = matcher.accepted([token, quote])  # one check for both, nothing committed
        if taken == 2 or (taken == 1 and matcher.completes([token])):
            return token
    return None


def _allowed_cheap(
    vocab: Vocab, order: int, used: np.ndarray, words: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The allowed tokens (ascending) whose cost in a walk (rank in ``token_ranks`` order
    ``order``: 0 closers first, 1 string content, plus ``used``) is below a multi-byte
    token's, and their costs: only tokens ranked so can be (``_MULTI_BYTE``), a few hundred."""
    ranks = token_ranks(vocab, order == 0)
    pool = vocab._once(f"closing_pool_{order}", lambda: np.flatnonzero(ranks < _MULTI_BYTE))
    cost = ranks[pool] + used[pool]
    bits = words[pool >> 5] >> (pool & 31).astype(np.uint32) & 1
    keep = (bits == 1) & (cost < _MULTI_BYTE)
    return pool[keep], cost[keep]


def completes(matcher: Matcher, tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` are all consumed and leave the output complete (matcher unchanged;
    the contract's ``Matcher.completes``)."""
    return matcher.completes(tokens)


def keeps_completion(
    matcher: Matcher, token: int, suffixes: Sequence[Sequence[int]], room: int
) -> list[int] | None:
    """The first of ``suffixes`` that completes the output after ``token`` with
    ``1 + len(suffix) + 1 <= room`` (the token, the suffix, end-of-sequence); else ``None``."""
    for suffix in sorted(suffixes, key=len):
        if len(suffix) + 2 > room:
            return None
        if completes(matcher, [token, *suffix]):
            return list(suffix)
    return None
