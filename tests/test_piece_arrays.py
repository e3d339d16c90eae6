"""``schema/piece_arrays.py``: each array equals its per-piece definition, on generated
pieces (every short byte string over bytes that matter to UTF-8 and JSON, and random
longer ones, with empty pieces among them)."""

from __future__ import annotations

import itertools
import random

import numpy as np

from constrained.grammars.token_shapes import open_bytes
from constrained.schema.piece_arrays import PieceArrays, byte_set

_ALPHABET = [0x00, 0x22, 0x41, 0x5C, 0x7D, 0x80, 0xBF, 0xC3, 0xE3, 0xF0, 0xF8, 0xFF]


def generated_pieces() -> list[bytes]:
    pieces = [b""]
    for size in range(1, 4):
        pieces += [bytes(p) for p in itertools.product(_ALPHABET, repeat=size)]
    rng = random.Random(0)
    pieces += [rng.randbytes(rng.randint(0, 9)) for _ in range(3000)]
    pieces.insert(7, b"")
    return pieces


def test_arrays_equal_their_per_piece_definitions() -> None:
    pieces = generated_pieces()
    arrays = PieceArrays.of(pieces)
    assert arrays.lengths.tolist() == [len(p) for p in pieces]
    quote_or_high = byte_set([0x22, *range(0x80, 0x100)])
    assert arrays.count_in(quote_or_high).tolist() == [
        sum(b == 0x22 or b >= 0x80 for b in p) for p in pieces
    ]
    assert arrays.any_in(quote_or_high).tolist() == [
        any(b == 0x22 or b >= 0x80 for b in p) for p in pieces
    ]
    assert arrays.all_in(quote_or_high).tolist() == [
        all(b == 0x22 or b >= 0x80 for b in p) for p in pieces
    ]
    for at in (0, 1, 3, -1, -2, -4):
        expected = [p[at] if -len(p) <= at < len(p) else -1 for p in pieces]
        assert arrays.byte_at(at).tolist() == expected, at
    leading = [len(p) - len(p.lstrip(bytes(range(0x80, 0xC0)))) for p in pieces]
    assert arrays.leading_continuations().tolist() == [min(n, 4) for n in leading]
    owed = arrays.open_bytes()
    assert owed.tolist() == [open_bytes(p) for p in pieces]
    assert set(np.unique(owed).tolist()) == {0, 1, 2, 3}


def test_pieces_all_empty_give_empty_arrays() -> None:
    arrays = PieceArrays.of([b"", b""])
    assert arrays.flat.size == 0
    assert arrays.any_in(byte_set(b"a")).tolist() == [False, False]
    assert arrays.all_in(byte_set(b"a")).tolist() == [True, True]
    assert arrays.byte_at(0).tolist() == [-1, -1]
