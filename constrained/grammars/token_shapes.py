"""What closing knows of a vocabulary's tokens from their bytes alone (built once per
vocabulary, ``Vocab._once``): their structure classes (``token_classes``: runs of plain
bytes collapsed, so ``"abc`` and ``"xy`` are one class) and their classes inside free text
(``text_classes``: ``a{b`` and ``,`` are text there), a wide row's allowed tokens grouped
by class (``class_spans``), whether a row is free text (``in_free_text``), and what a token
leaves half-written (``token_finish``: a UTF-8 character, a JSON escape; ``hex_finish``: a
``\\u`` escape's digits). ``ClosingMatcher`` checks a wide row per class: its shortest and
longest member stand for it (``grammars/closing_matcher.py``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.schema.piece_arrays import PieceArrays, byte_set

if TYPE_CHECKING:
    from constrained.grammars.vocab import Vocab

CLASS_SPAN_ROWS = 8  # wide rows whose class spans a vocabulary keeps (``class_spans``)
_PLAIN = np.ones(256, dtype=bool)
_PLAIN[list(b'"\\{}[],:\n\r\t')] = False  # bytes that can open or close a structure


def token_classes(vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Each token's structure class (runs of plain bytes collapsed) and its byte length."""
    return vocab._once("closing_classes", lambda: _classes(vocab, False))


TEXT_CLASSES = 1 << 20  # text classes' ids start here (never equal to a structure class's)
_TEXT = np.ones(256, dtype=bool)
_TEXT[list(b'"\\')] = False  # inside a JSON string only these end or escape the text
_TEXT[:0x20] = False  # (control bytes are not text there)
_PLAIN_RUNS = re.compile(
    b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if _PLAIN[b]) + b"]+"
).sub
_TEXT_RUN = re.compile(
    b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if _TEXT[b]) + b"]*"
).match
TEXT_PROBE = b"{}[],: a"  # a row allowing each as a token of its own is inside free text


def text_classes(vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Each token's class inside free text, where ``{}[],:`` are plain characters: the
    bytes before its first quote, backslash or control byte collapsed as one run, the rest
    as in ``token_classes`` (``a{b``, ``abc`` and ``,`` are one class; ``"`` ``}`` another),
    and the UTF-8 bounds. Ids from ``TEXT_CLASSES`` on; and the byte lengths."""
    return vocab._once("closing_text_classes", lambda: _classes(vocab, True))


def _classes(vocab: Vocab, text: bool) -> tuple[np.ndarray, np.ndarray]:
    """``token_classes`` (``text`` false) or ``text_classes``: the class ids, the lengths.

    A piece's key: each run of plain bytes as one ``\x00`` (inside free text, its bytes
    before the first quote, backslash or control byte are plain too), the other bytes as
    they are, then the UTF-8 bounds. Class ids are numbered by first appearance, by id.
    Most pieces are one plain run, so their key is their bounds alone: read from the arrays
    for all of them at once, the rest key by key."""
    pieces = vocab.token_bytes()
    arrays = piece_arrays(vocab)
    leading, owed = arrays.leading_continuations(), arrays.open_bytes()
    # A key's code: its bounds for one plain run (under 25), else 25 + the key's number.
    codes = leading * 5 + owed
    keyed = arrays.lengths > 0
    keyed &= ~arrays.all_in(_TEXT if text else _PLAIN)
    others: dict[bytes, int] = {}
    for token in np.flatnonzero(keyed).tolist():
        piece = pieces[token]
        shape = piece
        if text:  # (any plain byte stands for the text run: it collapses with what follows)
            inside = _TEXT_RUN(piece).end()
            shape = b"a" * inside + piece[inside:]
        runs = _PLAIN_RUNS(b"\x00", shape)
        if runs != b"\x00":
            key = runs + b"\xfe%c\xff%c" % (leading[token], owed[token])
            codes[token] = 25 + others.setdefault(key, len(others))
    present = np.flatnonzero(arrays.lengths > 0)
    unique, first, inverse = np.unique(codes[present], return_index=True, return_inverse=True)
    number = np.empty(unique.size, dtype=np.int64)  # each code's rank by first appearance
    number[np.argsort(first)] = np.arange(unique.size)
    classes = np.full(vocab.width, -1, dtype=np.int64)
    classes[present] = (TEXT_CLASSES if text else 0) + number[inverse]
    return classes, arrays.lengths.copy()


def piece_arrays(vocab: Vocab) -> PieceArrays:
    """The vocabulary's pieces as flat arrays (built once per vocabulary)."""
    return vocab._once("piece_arrays", lambda: PieceArrays.of(vocab.token_bytes()))


def class_order(vocab: Vocab, text: bool = False) -> np.ndarray:
    """Every token id ordered by class (``text_classes`` when ``text``, else
    ``token_classes``), then byte length, then id (a wide row's allowed tokens keep this
    order: its classes' shortest and longest members at their ends)."""

    def build() -> np.ndarray:
        classes, lengths = text_classes(vocab) if text else token_classes(vocab)
        return np.lexsort((lengths, classes))

    return vocab._once("closing_text_order" if text else "closing_class_order", build)


def class_spans(
    vocab: Vocab, words: np.ndarray, keep: np.ndarray, text: bool
) -> tuple[np.ndarray, list[tuple[int, int, int, int, int]]]:
    """A wide row's allowed tokens (``keep``, from its bitmask ``words``) in ``class_order``,
    and each class's span of them: ``(begin, end, class, shortest, longest)``. Kept per
    vocabulary for the last ``CLASS_SPAN_ROWS`` rows, by the row's words: it does not depend
    on the request, and the free-string rows of a batch's requests are one row (three
    passes over the vocabulary a sort, a fifth of the wide sorts' time, otherwise)."""
    spans_by_row: dict[tuple[bool, bytes], Any] = vocab._once("closing_class_spans", dict)
    key = (text, words.tobytes())
    found = spans_by_row.pop(key, None)
    if found is not None:
        spans_by_row[key] = found  # the most recent last: a batch's few common rows stay
        return found
    classes = (text_classes if text else token_classes)(vocab)[0]
    ordered = class_order(vocab, text)
    ordered = ordered[keep[ordered]]
    keys = classes[ordered]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], keys.size]
    firsts, lasts, named = ordered[starts], ordered[ends - 1], keys[starts]
    spans = list(zip(*(a.tolist() for a in (starts, ends, named, firsts, lasts)), strict=True))
    ordered.flags.writeable = False  # shared: callers slice it, never write it
    while len(spans_by_row) >= CLASS_SPAN_ROWS:  # the least recently used goes
        try:  # (a plain dict, each step atomic: the fill threads of engines in one process)
            spans_by_row.pop(next(iter(spans_by_row)), None)
        except (RuntimeError, StopIteration):  # another thread changed it meanwhile
            break
    spans_by_row[key] = (ordered, spans)
    return ordered, spans


def in_free_text(vocab: Vocab, words: np.ndarray) -> bool:
    """Whether a row allows each byte of ``TEXT_PROBE`` as a token of its own: free text
    (inside a JSON string), where those bytes write text as letters do; structure
    (JSON between values, a ``uri`` format's ``[::1]:80``) never allows all of them."""

    def build() -> np.ndarray:
        by_bytes = _by_bytes(vocab)
        return np.asarray([by_bytes.get(bytes([b]), -1) for b in TEXT_PROBE], dtype=np.int64)

    probe = vocab._once("closing_text_probe", build)
    if (probe < 0).any():
        return False
    return bool(np.all(words[probe // 32] >> (probe % 32).astype(np.uint32) & 1))


def _by_bytes(vocab: Vocab) -> dict[bytes, int]:
    """Each token's id by its bytes."""
    pieces = vocab.token_bytes()
    return vocab._once(
        "closing_by_bytes", lambda: {piece: i for i, piece in enumerate(pieces) if piece}
    )


def prefix_tokens(vocab: Vocab, text: bytes, most: int) -> set[int]:
    """The tokens whose bytes are ``text``'s first ``k`` bytes, ``1 <= k <= most``."""
    by_bytes = _by_bytes(vocab)
    found = {by_bytes.get(text[:k]) for k in range(1, min(len(text), most) + 1)}
    found.discard(None)
    return found  # type: ignore[return-value]


def after_text(piece: bytes) -> bytes:
    """A token's bytes after its leading run of free text (what ``text_classes`` keeps of
    it as written: ``","+`` for ``a","+``); empty for plain text."""
    return piece[_TEXT_RUN(piece).end() :]


def open_bytes(piece: bytes) -> int:
    """Continuation bytes still owed by a UTF-8 character the piece ends inside (0 if none)."""
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:  # the last character's lead byte
            size = (
                2
                if byte & 0xE0 == 0xC0
                else 3
                if byte & 0xF0 == 0xE0
                else 4
                if byte & 0xF8 == 0xF0
                else 1
            )
            return max(size - back, 0)
    return 0


SEAM_FREE, SEAM_OPEN, SEAM_WHOLE = 0, 1, 2  # ``utf8_seams``' kinds of a token's end
_CONTINUATION = byte_set(range(0x80, 0xC0))  # UTF-8 continuation bytes (10xxxxxx)


def utf8_seams(vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Per token id, how its bytes end (``SEAM_OPEN``: inside a UTF-8 character that starts
    in them, ``\\xe0`` or ``a\\xe3\\x82``; ``SEAM_WHOLE``: with a character that starts and
    ends in them, ``a`` or ``\\xe3\\x82\\xa4``; ``SEAM_FREE``: continuation bytes only, or
    none: what they leave open depends on what came before), and whether they begin with a
    continuation byte. After an open end only a text that begins with a continuation byte
    is valid UTF-8; after a whole one, never such a text (``seam_fits``)."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        arrays = piece_arrays(vocab)
        starts_char = ~arrays.all_in(_CONTINUATION)  # (b"": none, so free)
        first = arrays.byte_at(0)
        continues = (first >= 0) & (first & 0xC0 == 0x80)
        kinds = np.where(arrays.open_bytes() > 0, SEAM_OPEN, SEAM_WHOLE).astype(np.int8)
        kinds[~starts_char] = SEAM_FREE
        return kinds, continues

    return vocab._once("closing_utf8_seams", build)


def seam_fits(kind: int, continues: np.ndarray, suffix: list[int]) -> bool:
    """Whether ``suffix`` may follow a token whose end is of ``kind`` (``utf8_seams``) as
    valid UTF-8: an open end needs a suffix that continues its character, a whole one a
    suffix that does not (or none); a free end takes any. In a JSON schema's grammar (UTF-8
    text) ``Checker.check`` skips the known suffixes that cannot fit (one learnt after a
    lead byte, ``\\xbb\\xbf":""}``, tried after plain text; plain ones tried after a lead
    byte: three tries in ten in a batch near its budget), each of which its matcher
    refuses. Not in other grammars: llguidance's Lark ``~`` may match invalid UTF-8."""
    if kind == SEAM_FREE:
        return True
    follows = bool(suffix) and bool(continues[suffix[0]])
    return follows == (kind == SEAM_OPEN)


def token_finish(vocab: Vocab, token: int) -> tuple[int, ...]:
    """Tokens that finish what a token leaves half-written (none when nothing): the UTF-8
    character it ends inside (one token of the continuation bytes it owes where the
    vocabulary has one, ``\\xbb\\xbf`` after ``\\xe0``, or two, ``\\x9f\\x98`` ``\\x80`` after
    ``\\xf0``; else the lowest single bytes its lead byte allows), or a JSON escape its last
    backslash opens (``"``: ``\\"``)."""

    def build() -> dict[int, tuple[int, ...]]:
        by_bytes = _by_bytes(vocab)
        quote = by_bytes.get(b'"')
        finish: dict[int, tuple[int, ...]] = {}
        pieces, arrays = vocab.token_bytes(), piece_arrays(vocab)
        low = by_bytes.get(b"\x80")
        tails: dict[int, list[int]] = {}  # tokens of 2 or 3 continuation bytes, by length
        short = (arrays.lengths > 1) & (arrays.lengths < 4)
        for tok in np.flatnonzero(short & arrays.all_in(_CONTINUATION)).tolist():
            tails.setdefault(len(pieces[tok]), []).append(tok)
        # Only a piece that ends inside a character or with a backslash leaves anything.
        owes = arrays.open_bytes()
        for tok in np.flatnonzero((owes > 0) | (arrays.byte_at(-1) == 0x5C)).tolist():
            piece, owed = pieces[tok], int(owes[tok])
            if not owed:
                slashes = len(piece) - len(piece.rstrip(b"\\"))
                if slashes % 2 and quote is not None:
                    finish[tok] = (quote,)
                continue
            start = len(piece) - next(back for back in range(1, 5) if piece[-back] & 0xC0 != 0x80)
            lead = piece[start:]
            whole = next((t for t in tails.get(owed, ()) if _decodes(lead + pieces[t])), None)
            if whole is not None:
                finish[tok] = (whole,)
                continue
            if owed == 3 and low is not None:  # two tokens, not three
                pairs = (t for t in tails.get(2, ()) if _decodes(lead + pieces[t] + b"\x80"))
                two = next(pairs, None)
                if two is not None:
                    finish[tok] = (two, low)
                    continue
            for first in (0x80, 0x90, 0xA0):  # E0 needs A0+, F0 90+, ED and F4 below them
                more = bytes([first] + [0x80] * (owed - 1))
                if not _decodes(lead + more):
                    continue
                ids = [by_bytes.get(bytes([b])) for b in more]
                if all(i is not None for i in ids):
                    finish[tok] = tuple(ids)  # type: ignore[arg-type]
                break
        return finish

    return vocab._once("closing_token_finish", build).get(token, ())


_OPEN_ESCAPE = re.compile(rb"(?:^|[^\\])(?:\\\\)*\\u([0-9A-Fa-f]{0,3})$")


def owed_hex_digits(text: bytes) -> int:
    """Hex digits still owed by a JSON ``\\u`` escape ``text`` ends inside (0 if none):
    ``#\\uD`` owes 3. A heuristic on the last bytes (the backslash counted as escaping
    when an even run of them precedes it): what it proposes, the matcher checks."""
    found = _OPEN_ESCAPE.search(text)
    return 4 - len(found.group(1)) if found else 0


def hex_finish(vocab: Vocab, owed: int) -> tuple[int, ...]:
    """The fewest tokens that write ``owed`` hex digits (``ace`` for 3), the longest
    first; none if the vocabulary has no such tokens."""

    def build() -> dict[int, int]:
        digits = set(b"0123456789abcdefABCDEF")
        by_size: dict[int, int] = {}
        for token, piece in enumerate(vocab.token_bytes()):
            if 0 < len(piece) <= 4 and all(b in digits for b in piece):
                by_size.setdefault(len(piece), token)
        return by_size

    by_size = vocab._once("closing_hex_tokens", build)
    out: list[int] = []
    while owed > 0:
        size = max((n for n in by_size if n <= owed), default=0)
        if not size:
            return ()
        out.append(by_size[size])
        owed -= size
    return tuple(out)


def _decodes(text: bytes) -> bool:
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True
