"""The tokenizer's tables (``grammars/vocab.py``), built the fast way, equal the slow ones.

``token_bytes`` decodes the byte-level pieces through one ``str.translate``; the llguidance
tokenizer is built over those bytes instead of from the tokenizer's JSON. Both must give
what the straightforward builds give, id for id, on both embedded tokenizers (Qwen2.5's,
with 271 logits past the tokenizer, and Qwen3.6's).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from constrained.grammars.vocab import Vocab, _byte_decoder, load_vocab
from constrained.tiny_model import VOCABS, build_tiny_model


@pytest.fixture(scope="module", params=sorted(VOCABS))
def vocab(request) -> Vocab:
    # The process's own (other tests' too): what the engine and admission build.
    return load_vocab(str(build_tiny_model(request.param)), VOCABS[request.param].logits_width)


def reference_token_bytes(vocab: Vocab) -> list[bytes]:
    """Each piece decoded character by character (the build before the fast one)."""
    tok = vocab.hf_tokenizer
    added = tok.added_tokens_decoder
    special = set(tok.all_special_ids) | {i for i, t in added.items() if t.special}
    decoder = _byte_decoder()
    out = [b""] * vocab.width
    for piece, token_id in tok.get_vocab().items():
        if token_id >= vocab.width or token_id in special:
            continue
        if token_id in added:
            out[token_id] = piece.encode()
        elif all(ch in decoder for ch in piece):
            out[token_id] = bytes(decoder[ch] for ch in piece)
        else:
            out[token_id] = tok.convert_tokens_to_string([piece]).encode()
    return out


def test_token_bytes_equal_the_character_by_character_decode(vocab: Vocab) -> None:
    fast = vocab.token_bytes()
    assert len(fast) == vocab.width
    assert fast == reference_token_bytes(vocab)
    assert sum(1 for piece in fast if piece) > 100_000


def test_llguidance_tokenizer_equals_its_hugging_face_build(vocab: Vocab) -> None:
    import llguidance.hf

    ours = vocab.llguidance()
    theirs = llguidance.hf.from_tokenizer(
        vocab.hf_tokenizer, n_vocab=vocab.width, eos_token=vocab.eos_token_id
    )
    assert (ours.vocab_size, ours.eos_tokens) == (theirs.vocab_size, theirs.eos_tokens)
    assert ours.is_canonical == theirs.is_canonical
    ids = list(range(vocab.width))
    differing = [
        i
        for i in ids
        if ours.decode_bytes([i]) != theirs.decode_bytes([i])
        or ours.is_special_token(i) != theirs.is_special_token(i)
        or ours.dbg_tokens([i]) != theirs.dbg_tokens([i])
    ]
    assert differing == []
    past = range(len(vocab.hf_tokenizer), vocab.width)  # logits past the tokenizer
    assert all(ours.is_special_token(i) for i in past)
    # Tokenizing (llguidance's forced tokens): random texts of whole pieces, some with a
    # special token's text and some cut mid-character.
    rng = random.Random(0)
    pieces = [p for p in vocab.token_bytes() if p]
    for k in range(600):
        text = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        if k % 5 == 0:
            text += b"<|im_end|>" + rng.choice(pieces)
        assert ours.tokenize_bytes(text) == theirs.tokenize_bytes(text), text
        if k % 3 == 0:
            as_str = text.decode("utf-8", "replace")
            assert ours.tokenize_str(as_str) == theirs.tokenize_str(as_str), as_str


def reference_classes(vocab: Vocab, text: bool) -> list[int]:
    """Each piece's class key built byte by byte (the build before the regex one), numbered
    in order of first appearance as ``token_shapes`` numbers them."""
    from constrained.grammars.token_shapes import _PLAIN, _TEXT, TEXT_CLASSES, open_bytes

    keys: dict[bytes, int] = {}
    out = [-1] * vocab.width
    for token, piece in enumerate(vocab.token_bytes()):
        if not piece:
            continue
        key, inside = bytearray(), text
        for byte in piece:
            inside = inside and _TEXT[byte]
            plain = inside or _PLAIN[byte]
            if not (plain and key[-1:] == b"\x00"):
                key.append(0 if plain else byte)
        leading = len(piece) - len(piece.lstrip(bytes(range(0x80, 0xC0))))
        key += b"\xfe%c\xff%c" % (min(leading, 4), open_bytes(piece))
        out[token] = (TEXT_CLASSES if text else 0) + keys.setdefault(bytes(key), len(keys))
    return out


def test_closing_classes_equal_the_byte_by_byte_build(vocab: Vocab) -> None:
    from constrained.grammars.token_shapes import text_classes, token_classes

    for text, (classes, lengths) in ((False, token_classes(vocab)), (True, text_classes(vocab))):
        assert classes.tolist() == reference_classes(vocab, text)
        assert lengths.tolist() == [len(piece) for piece in vocab.token_bytes()]


def test_utf8_seams_equal_the_piece_by_piece_build(vocab: Vocab) -> None:
    """``utf8_seams``, built over all the pieces' bytes at once, gives each piece's kind of
    end (by ``open_bytes``, as closing's classes read it) and first byte as a loop does."""
    from constrained.grammars.token_shapes import (
        SEAM_FREE,
        SEAM_OPEN,
        SEAM_WHOLE,
        open_bytes,
        utf8_seams,
    )

    kinds, continues = utf8_seams(vocab)
    for token, piece in enumerate(vocab.token_bytes()):
        starts_char = any(byte & 0xC0 != 0x80 for byte in piece)
        kind = (SEAM_OPEN if open_bytes(piece) else SEAM_WHOLE) if starts_char else SEAM_FREE
        assert kinds[token] == kind, (token, piece)
        assert continues[token] == (bool(piece) and piece[0] & 0xC0 == 0x80), (token, piece)
    assert {int(k) for k in kinds} == {SEAM_FREE, SEAM_OPEN, SEAM_WHOLE}


def test_closing_ranks_equal_the_piece_by_piece_ranks(vocab: Vocab) -> None:
    """``token_ranks`` decides most pieces by their length at once; each equals ``_rank``."""
    from constrained.grammars.closing import _NEVER, _rank, token_ranks

    for closers_first in (True, False):
        expected = [_rank(piece, closers_first) for piece in vocab.token_bytes()]
        expected[vocab.eos_token_id] = int(_NEVER)
        assert token_ranks(vocab, closers_first).tolist() == expected


def reference_token_reach(pieces: list[bytes]) -> dict[str, list]:
    """``json_scan.token_reach``'s per-token arrays, each piece read on its own."""
    from constrained.schema.json_scan import _ESCAPES, _STRUCTURAL, _reach, _starts_scalar

    out: dict[str, list] = {"low0": [], "low1": [], "bracket0": [], "bracket1": [], "bare": []}
    out.update({f"escaped{e}": [] for e in _ESCAPES})
    for piece in pieces:
        structural = bool(_STRUCTURAL.intersection(piece))
        for inside in (0, 1):
            low, bracket, bare = _reach(piece, bool(inside)) if structural else (127, False, 0)
            out[f"low{inside}"].append(low)
            out[f"bracket{inside}"].append(bracket)
            if not inside:
                bare = bare if structural else any(b in b", \t\n\rel" for b in piece)
                out["bare"].append(bool(bare))
        for escape in _ESCAPES:
            skip = escape if escape > 0 else (5 if piece[:1] == b"u" else 1)
            found = _reach(piece[skip:], True)[:2] if structural else (127, False)
            out[f"escaped{escape}"].append(found)
    out["scalar_start"] = [_starts_scalar(p.lstrip(b", \t\n\r")) for p in pieces]
    out["number_next"] = [bool(p) and p[0] in b"0123456789.eE" for p in pieces]
    return out


def test_token_reach_equals_the_piece_by_piece_reach(vocab: Vocab) -> None:
    """``token_reach`` reads only pieces with a quote, bracket or backslash one by one (and
    the few that may start a scalar); every array equals the piece-by-piece definition."""
    from constrained.schema.json_scan import token_reach

    pieces = vocab.token_bytes()
    reach, expected = token_reach(pieces), reference_token_reach(pieces)
    assert reach.outside_low.tolist() == expected["low0"]
    assert reach.inside_low.tolist() == expected["low1"]
    assert reach.outside_bracket.tolist() == expected["bracket0"]
    assert reach.inside_bracket.tolist() == expected["bracket1"]
    assert reach.outside_bare.tolist() == expected["bare"]
    assert reach.scalar_start.tolist() == expected["scalar_start"]
    assert reach.number_next.tolist() == expected["number_next"]
    for escape, (low, bracket) in reach.escaped.items():
        pairs = list(zip(low.tolist(), bracket.tolist(), strict=True))
        assert pairs == expected[f"escaped{escape}"]
    assert sum(expected["scalar_start"]) > 100 and sum(expected["bare"]) > 1000


def reference_token_finish(vocab: Vocab) -> dict[int, tuple[int, ...]]:
    """``token_finish`` of every token, each piece read on its own (the build before the
    arrays chose which to read)."""
    from constrained.grammars.token_shapes import _by_bytes, _decodes, open_bytes

    by_bytes, pieces = _by_bytes(vocab), vocab.token_bytes()
    quote, low = by_bytes.get(b'"'), by_bytes.get(b"\x80")
    tails: dict[int, list[int]] = {}
    for tok, piece in enumerate(pieces):
        if 1 < len(piece) < 4 and all(b & 0xC0 == 0x80 for b in piece):
            tails.setdefault(len(piece), []).append(tok)
    finish: dict[int, tuple[int, ...]] = {}
    for tok, piece in enumerate(pieces):
        owed = open_bytes(piece) if piece else 0
        if not owed:
            if (len(piece) - len(piece.rstrip(b"\\"))) % 2 and quote is not None:
                finish[tok] = (quote,)
            continue
        lead = piece[len(piece) - next(b for b in range(1, 5) if piece[-b] & 0xC0 != 0x80) :]
        whole = next((t for t in tails.get(owed, ()) if _decodes(lead + pieces[t])), None)
        if whole is not None:
            finish[tok] = (whole,)
            continue
        if owed == 3 and low is not None:
            pairs = (t for t in tails.get(2, ()) if _decodes(lead + pieces[t] + b"\x80"))
            two = next(pairs, None)
            if two is not None:
                finish[tok] = (two, low)
                continue
        for first in (0x80, 0x90, 0xA0):
            more = bytes([first] + [0x80] * (owed - 1))
            if _decodes(lead + more):
                ids = [by_bytes.get(bytes([b])) for b in more]
                if all(i is not None for i in ids):
                    finish[tok] = tuple(ids)
                break
    return finish


def test_token_finish_equals_the_piece_by_piece_build(vocab: Vocab) -> None:
    from constrained.grammars.token_shapes import token_finish

    expected = reference_token_finish(vocab)
    assert len(expected) > 500  # (half characters and backslashes: Qwen has many)
    assert {t: token_finish(vocab, t) for t in range(vocab.width) if token_finish(vocab, t)} == (
        expected
    )


def reference_number_tokens(pieces: list[bytes]) -> tuple:
    """The finite-number rule's token table, token by token (the build before the arrays)."""
    from constrained.schema import finite_numbers as f

    words = np.zeros((len(pieces) + 31) // 32, dtype=np.uint32)
    most, risky = 1, []
    for token, piece in enumerate(pieces):
        if piece and piece[0] in f._NUMBER_BYTES:
            words[token // 32] |= np.uint32(1 << (token % 32))
            run = piece[: len(piece) - len(piece.lstrip(b"0123456789+-.eE"))]
            most = max(most, sum(byte in f._DIGITS for byte in run))
        if f._RISKY.search(piece):
            risky.append(token)
    moves = f._OUT_MOVES | f._OPENING | f._CLOSING
    return (
        words, most, tuple(risky),
        [not (f._OUT_MOVES & set(piece)) for piece in pieces],
        [f._QUOTE not in piece and f._BACKSLASH not in piece for piece in pieces],
        [not (moves & set(piece)) for piece in pieces],
    )  # fmt: skip


def number_pieces_cases(vocab: Vocab) -> list[list[bytes]]:
    """The vocabulary's pieces, a structural tag's (specials as text), and random pieces
    made of number bytes, with the two ways a number overflows within one token."""
    from constrained.grammars.marker import text_pieces

    rng = random.Random(0)
    alphabet = b'0123456789+-.eE"\\{}[]ax '
    made = [bytes(rng.choices(alphabet, k=rng.randint(0, 12))) for _ in range(20_000)]
    return [vocab.token_bytes(), text_pieces(vocab), [*made, b"1" * 309, b"12e+345", b"9E308"]]


def test_number_tokens_equal_the_token_by_token_build(vocab: Vocab) -> None:
    from constrained.schema.finite_numbers import number_tokens

    for pieces in number_pieces_cases(vocab):
        words, most, risky, keeps_out, keeps_string, keeps_tagged_out = reference_number_tokens(
            pieces
        )
        table = number_tokens(pieces)
        assert table.continues.dtype == np.uint32 and np.array_equal(table.continues, words)
        assert (table.most_digits, table.risky) == (most, risky)
        assert table.keeps_out == keeps_out and table.keeps_string == keeps_string
        assert table.keeps_tagged_out == keeps_tagged_out
    assert number_tokens(pieces).risky  # (the random pieces overflow: the check has cases)


def test_fingerprint_follows_what_the_backends_see(vocab: Vocab) -> None:
    """The store's key for a tokenizer: equal for the same tables, different when one
    token's bytes, a special token's text, end-of-sequence or the width differ."""
    tok = vocab.hf_tokenizer

    def fingerprint(eos: int = vocab.eos_token_id, width: int = vocab.width, **built) -> str:
        other = Vocab(tok, width, eos, key="other")
        other._built.update(built)
        return other.fingerprint()

    pieces = list(vocab.token_bytes())
    assert fingerprint() == vocab.fingerprint()
    changed = pieces.copy()
    changed[1000] += b"x"
    assert fingerprint(bytes=changed) != vocab.fingerprint()
    moved = pieces.copy()  # the same bytes split elsewhere between two tokens
    moved[1000], moved[1001] = pieces[1000] + pieces[1001][:1], pieces[1001][1:]
    assert fingerprint(bytes=moved) != vocab.fingerprint()
    assert fingerprint(eos=vocab.eos_token_id - 1) != vocab.fingerprint()
    # one more id past the tokenizer (a wider logits row): told apart by the lengths
    assert fingerprint(width=vocab.width + 1, bytes=[*pieces, b""]) != vocab.fingerprint()
    specials = vocab.special_ids()
    fewer = fingerprint(bytes=pieces, special_ids=specials[1:])  # one id no longer special
    assert fewer != vocab.fingerprint()

    special = vocab.special_ids()[0]

    class Renamed:  # the same tokenizer, one special token spelt otherwise
        def __getattr__(self, name):
            return getattr(tok, name)

        def convert_ids_to_tokens(self, token_id):
            return "<|renamed|>" if token_id == special else tok.convert_ids_to_tokens(token_id)

    renamed = Vocab(Renamed(), vocab.width, vocab.eos_token_id, key="renamed")
    renamed._built.update(bytes=pieces, special_ids=vocab.special_ids())
    assert renamed.fingerprint() != vocab.fingerprint()
