"""JSON numbers a double cannot hold: following a JSON text's numbers, token by token.

JSON's grammar lets a number be as long as it likes: ``1e999`` and a 400-digit ``1.5`` are
valid JSON text. Every JSON parser that reads numbers as doubles (Python's ``json`` for any
number with a fraction or an exponent, JavaScript's ``JSON.parse``) reads them as
infinity, and a writer then emits ``Infinity``, which is not JSON: vLLM's tool parsers
re-serialize a call's arguments that way. RFC 8259 (section 6) leaves such numbers to the
implementation; we never let one be written.

The rule: **every prefix of a number, read as a double, is finite** (a trailing ``.``,
``e``, ``e+``, ``e-`` or a lone ``-`` dropped first). Appending bytes only ever grows a
number's magnitude within its integer digits or a non-negative exponent, so a number that
keeps this rule at each token is finite when it ends; and a finite prefix can always end in
one byte (``0`` after a ``.``, ``e`` or sign, else nothing), so the rule leads to no dead end.
It also refuses integers of 309 digits or more, which a double cannot hold either.

``NumberState`` follows the text (outside any value, in a string, just after a backslash in
one, in a number); ``advance`` moves it over a token's bytes and says whether a number broke
the rule. ``NumberTokens`` is what a vocabulary needs for the per-step check: which tokens
can go on with a number, the most digits any of them writes, and the few
tokens that could break the rule by themselves.

Example::

    >>> state, ok = advance(START, b'{"x": 1e3')
    >>> ok, state.number
    (True, b'1e3')
    >>> advance(state, b"09")[1]
    False
    >>> advance(START, b'{"x": "1e999"}')[1]
    True
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

from constrained.schema.piece_arrays import PieceArrays, byte_set

OUT, STRING, ESCAPE, NUMBER, FREE = range(5)
_QUOTE, _BACKSLASH = 0x22, 0x5C
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_NUMBER_STARTS = frozenset(b"-0123456789")
_DIGITS = frozenset(b"0123456789")
_OUT_MOVES = _NUMBER_STARTS | {_QUOTE}  # bytes that move the text out of ``OUT``
_UNFINISHED = b".eE+-"  # bytes a number cannot end with
# A number under 10**308 is finite: with ``w`` integer digits and an exponent ``E``, it is
# under 10**(w + E).
_LARGEST_POWER = 308
# A token that could break the rule on its own: a mantissa digit then an exponent of three
# digits, or a run of integer digits as long as a double's largest.
_RISKY = re.compile(rb"[0-9]\.?[0-9]*[eE]\+?[0-9]{3}|[0-9]{309}")


@dataclass(frozen=True, slots=True)
class NumberState:
    """Where the text stands: ``mode`` (``OUT``, ``STRING``, ``ESCAPE``, ``NUMBER``; ``FREE``:
    outside JSON, in a structural tag's free text), in a number its bytes so far, and in a
    tagged text the JSON value's nesting (``depth``) or, outside it, the free text's longest
    end that a tag's ``begin`` starts with (``tail``: all a ``begin`` still to come can
    depend on, so most free text leaves the state as it was)."""

    mode: int = OUT
    number: bytes = b""
    depth: int = 0
    tail: bytes = b""


START = NumberState()  # a JSON document
FREE_START = NumberState(FREE)  # a structural tag: free text until a JSON part's begin
_OPENING, _CLOSING = frozenset(b"{["), frozenset(b"}]")


def finite(number: bytes) -> bool:
    """Whether ``number`` (a JSON number or a prefix of one) reads as a finite double."""
    text = number.rstrip(_UNFINISHED)
    try:
        return not text or not math.isinf(float(text))
    except ValueError:  # not a number: the grammar refuses it, this rule has no say
        return True


def advance(
    state: NumberState, data: bytes, opens: tuple[bytes, ...] = ()
) -> tuple[NumberState, bool]:
    """``state`` after ``data``, and whether every number in it kept the rule (a number
    still open at the end is judged as its prefix).

    ``opens``: for a structural tag, the ``begin`` literals after which a JSON value starts;
    the text is free outside those values (``FREE``). Empty: the text is one JSON document.
    """
    mode, number, depth, tail = state.mode, bytearray(state.number), state.depth, state.tail
    for byte in data:
        if mode == NUMBER:
            if byte in _NUMBER_BYTES:
                number.append(byte)
                continue
            if not finite(bytes(number)):
                return NumberState(OUT), False
            number.clear()
            # the byte after the number, read where the number leaves the text (a tag's
            # value that was this number: free text again, from an empty ``tail``)
            mode = FREE if opens and depth == 0 else OUT
        if mode == FREE:
            tail, begun = _free_tail(tail, byte, opens)
            if begun:
                mode, depth, tail = OUT, 0, b""
            continue
        if mode == STRING:
            if byte == _BACKSLASH:
                mode = ESCAPE
            elif byte == _QUOTE:
                mode = FREE if opens and depth == 0 else OUT
            continue
        if mode == ESCAPE:
            mode = STRING
            continue
        if byte == _QUOTE:  # OUT
            mode = STRING
        elif byte in _NUMBER_STARTS:
            mode = NUMBER
            number.append(byte)
        elif opens and byte in _OPENING:
            depth += 1
        elif opens and byte in _CLOSING:
            depth -= 1
            if depth <= 0:
                mode, depth = FREE, 0
    if mode == NUMBER:
        kept = bytes(number)
        return NumberState(NUMBER, kept, depth), finite(kept)
    return NumberState(mode, b"", depth, tail), True


def _free_tail(tail: bytes, byte: int, opens: tuple[bytes, ...]) -> tuple[bytes, bool]:
    """Free text's ``tail`` after ``byte`` (its longest end that some ``begin`` starts with),
    and whether the text now ends with a ``begin``."""
    starts, lasts = _begins(opens)
    tail += bytes((byte,))
    while tail and tail not in starts:
        tail = tail[1:]
    # a begin the text ends with is an end of it that a begin starts with: within the tail
    return tail, byte in lasts and any(tail.endswith(begin) for begin in opens)


@functools.cache
def _begins(opens: tuple[bytes, ...]) -> tuple[frozenset[bytes], frozenset[int]]:
    """Every non-empty start of a ``begin``, and the bytes a ``begin`` ends with."""
    starts = frozenset(begin[:n] for begin in opens for n in range(1, len(begin) + 1))
    return starts, frozenset(begin[-1] for begin in opens if begin)


def may_break(state: NumberState, most_digits: int) -> bool:
    """Whether some token that writes at most ``most_digits`` digits could break the rule
    after ``state`` (``False`` is certain; ``True`` means check the candidates)."""
    if state.mode != NUMBER:
        return False
    mantissa, exponent_mark, exponent = state.number.lstrip(b"-").lower().partition(b"e")
    whole = len(mantissa.partition(b".")[0])
    grow = min(most_digits, 6)  # (past 6 digits, anything may break)
    if not exponent_mark:  # the token may add integer digits, or an exponent of its digits
        return whole + max(grow, 10**grow - 1) > _LARGEST_POWER
    if exponent.startswith(b"-"):
        return False  # more digits only shrink it
    digits = exponent.lstrip(b"+")
    if len(digits) > 4:
        return True
    largest = (int(digits or b"0") + 1) * 10**grow - 1
    return whole + largest > _LARGEST_POWER


@dataclass(frozen=True)
class NumberTokens:
    """A vocabulary's tokens as the rule needs them (``number_tokens`` builds it).

    ``continues``: packed bitmask words (uint32) of the tokens whose first byte can go on
    with a number; ``most_digits``: the most digits any of them writes before its first
    byte that cannot be in a number; ``risky``:
    the tokens that could break the rule within themselves (checked whatever the state);
    ``pieces``: each token's bytes; ``keeps_out`` / ``keeps_string``: below.
    """

    continues: np.ndarray
    most_digits: int
    risky: tuple[int, ...]
    pieces: list[bytes]
    #: per token: it leaves ``OUT`` as it is (no quote, no number byte) / ``STRING`` (no
    #: quote, no backslash): most tokens, followed without a look at their bytes
    keeps_out: list[bool]
    keeps_string: list[bool]
    #: in a structural tag's JSON value: no quote, number byte or bracket either
    keeps_tagged_out: list[bool]


def number_tokens(pieces: list[bytes], arrays: PieceArrays | None = None) -> NumberTokens:
    """``NumberTokens`` of a vocabulary whose token ``i`` writes ``pieces[i]`` (``arrays``:
    the same pieces as flat arrays, where the caller has them). Decided over the flat arrays
    (0.2 s a process for Qwen's 152k tokens one by one), with a Python step only for the
    tokens a number can go on with (their digits) or break in (four digits or more)."""
    arrays = PieceArrays.of(pieces) if arrays is None else arrays
    first = arrays.byte_at(0)
    continues = (first >= 0) & byte_set(_NUMBER_BYTES)[np.maximum(first, 0)]
    bits = np.zeros(-(-len(pieces) // 32) * 32, dtype=bool)
    bits[: len(pieces)] = continues
    words = np.packbits(bits, bitorder="little").view("<u4").astype(np.uint32)
    most = 1
    for token in np.flatnonzero(continues).tolist():
        piece = pieces[token]
        run = piece[: len(piece) - len(piece.lstrip(b"0123456789+-.eE"))]
        most = max(most, sum(byte in _DIGITS for byte in run))
    # _RISKY needs four digits at least: the rest cannot match.
    maybe = np.flatnonzero(arrays.count_in(byte_set(_DIGITS)) >= 4).tolist()
    risky = tuple(token for token in maybe if _RISKY.search(pieces[token]))
    moves = _OUT_MOVES | _OPENING | _CLOSING
    return NumberTokens(
        words,
        most,
        risky,
        pieces,
        (~arrays.any_in(byte_set(_OUT_MOVES))).tolist(),
        (~arrays.any_in(byte_set({_QUOTE, _BACKSLASH}))).tolist(),
        (~arrays.any_in(byte_set(moves))).tolist(),
    )
