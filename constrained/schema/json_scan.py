"""Following JSON text byte by byte: where each value starts and ends, which array holds it.

``Scan`` is the state after some bytes of one JSON document (open containers, and whether it
is inside a string, a number or literal, a key); ``feed`` advances it and calls ``Events`` when
an array opens, one of its items completes, or it closes. It does not validate: the grammar
has already allowed every byte it is given. No vLLM, no backend.

``token_reach`` summarizes each vocabulary token for the look-up ``checked_row`` does
before a mask: how far out of the current nesting a token can close, so only the tokens
that can complete an item or close an array are followed byte by byte.

Example::

    >>> events = Recorder()
    >>> scan = Scan()
    >>> feed(scan, b'{"a": [1, "x", [2]]}', 0, bytearray(), events)
    True
    >>> events.items
    [b'1', b'"x"', b'2', b'[2]']
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from constrained.schema.piece_arrays import PieceArrays, byte_set

OBJECT, ARRAY = 0, 1
VALUE, AFTER, KEY, COLON, STRING, SCALAR = range(6)  # what the next byte may be
_WHITESPACE = frozenset(b" \t\n\r")
_SCALAR = frozenset(b"0123456789+-.eE")  # number bytes
_LITERAL_TAIL = {0x74: 3, 0x66: 4, 0x6E: 3}  # true, false, null: letters after the first
NO_CLOSE = 127  # ``token_reach``: the token closes nothing


@dataclass
class Frame:
    """One open object or array.

    ``nodes``/``rules``: what ``CheckPlan`` says of it; ``count``: items (or members) so far;
    ``item_start``: where the current item's text starts; ``key``: the member being written;
    ``seen``/``raw``: ``uniqueItems``' items so far, as values and as written;
    ``matched``/``loose``: each ``contains``' matches, judged strictly (for ``minContains``)
    and loosely (for ``maxContains``). Immutable values, so a copied frame shares them until
    it changes them.
    """

    kind: int
    nodes: frozenset
    rules: Any = None
    count: int = 0
    item_start: int = -1
    key: str | None = None
    seen: frozenset = frozenset()
    raw: tuple[bytes, ...] = ()
    matched: tuple[int, ...] = ()
    loose: tuple[int, ...] = ()


@dataclass
class Scan:
    """The state of one JSON document after the bytes fed so far."""

    stack: list[Frame] = field(default_factory=list)
    mode: int = VALUE
    in_key: bool = False
    escape: int = 0  # in a string: 0, -1 after a backslash, n hex digits of \\u still to come
    start: int = 0  # where the string or scalar being read started
    literal: int = 0  # letters of true / false / null still to come (0: a number)

    def copy(self) -> Scan:
        frames = [Frame(**vars(f)) for f in self.stack]
        return Scan(frames, self.mode, self.in_key, self.escape, self.start, self.literal)

    def in_item(self, frame_index: int) -> bool:
        """Whether an item of the array at ``frame_index`` is being written (a container,
        string or scalar open inside it)."""
        return frame_index < len(self.stack) - 1 or self.mode in (STRING, SCALAR)

    def depth_in(self, frame_index: int) -> int:
        """Levels (containers, a string) open inside the frame at ``frame_index``."""
        return len(self.stack) - 1 - frame_index + (self.mode == STRING)


class Events(Protocol):
    """What ``feed`` reports; a False answer stops it (the text breaks a check)."""

    def opened(self, frame: Frame, parent: Frame | None) -> None: ...

    def item(self, frame: Frame, text: bytes) -> bool: ...

    def closed(self, frame: Frame) -> bool: ...


class Recorder:
    """``Events`` that keeps every array item's text (for tests and the docstring)."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def opened(self, frame: Frame, parent: Frame | None) -> None:
        frame.rules = True

    def item(self, frame: Frame, text: bytes) -> bool:
        self.items.append(text)
        return True

    def closed(self, frame: Frame) -> bool:
        return True


def feed(scan: Scan, data: bytes, base: int, before: bytearray, events: Events) -> bool:
    """Advance ``scan`` over ``data``, which starts at offset ``base`` of the document whose
    first ``base`` bytes are ``before``; False as soon as ``events`` refuses.

    On the per-token path (a call per token, and per token a look-ahead follows): the loop
    itself passes over the bytes that only move on (string content, a number's digits,
    whitespace); each byte with a meaning is one ``_Feed`` method call."""
    fed = _Feed(scan, data, base, before, events)  # one object per call, no closures
    for offset, byte in enumerate(data):
        at = base + offset
        mode = scan.mode
        if mode == STRING:  # only an escape or the closing quote matters in a string
            if (scan.escape or byte == 0x5C or byte == 0x22) and not fed.in_string(byte, at):
                return False
            continue
        if mode == SCALAR:
            if scan.literal:  # a literal is complete at its last letter
                scan.literal -= 1
                if not scan.literal and not fed.ended(at + 1):
                    return False
                continue
            if byte in _SCALAR:
                continue
            if not fed.ended(at):  # the byte after a number: read as after a value
                return False
            mode = AFTER
        if byte in _WHITESPACE:
            continue
        if mode == VALUE:
            fits = fed.value_starts(byte, at)
        elif mode == AFTER:
            fits = fed.after_value(byte, at)
        elif mode == KEY:
            fits = fed.key_starts(byte, at)
        else:  # COLON
            if byte == 0x3A:
                scan.mode = VALUE
            continue
        if not fits:
            return False
    return True


class _Feed:
    """``feed``'s state for one call: the bytes fed, where they start in the document, and
    the steps a byte with a meaning takes (a value starts, ends, a container opens or
    closes). Each step that completes an array item or closes an array asks ``events``:
    its False stops ``feed``."""

    __slots__ = ("base", "before", "data", "events", "scan")

    def __init__(
        self, scan: Scan, data: bytes, base: int, before: bytearray, events: Events
    ) -> None:
        self.scan = scan
        self.data = data
        self.base = base
        self.before = before
        self.events = events

    def text(self, start: int, end: int) -> bytes:
        """The document's bytes ``start:end`` (``end`` within ``data``)."""
        base, data = self.base, self.data
        if start >= base:
            return data[start - base : end - base]
        return bytes(self.before[start:base]) + data[: end - base]

    def in_string(self, byte: int, at: int) -> bool:
        """An escape's byte, a backslash or a quote, inside a string."""
        scan = self.scan
        if scan.escape:
            scan.escape = (4 if byte == 0x75 else 0) if scan.escape < 0 else scan.escape - 1
        elif byte == 0x5C:
            scan.escape = -1
        elif byte == 0x22:
            if scan.in_key:
                scan.stack[-1].key = json.loads(self.text(scan.start, at + 1))
                scan.mode = COLON
            else:
                return self.ended(at + 1)
        return True

    def value_starts(self, byte: int, at: int) -> bool:
        """Where a value may start: it does, or ``]`` closes an empty array."""
        scan = self.scan
        if byte == 0x5D and scan.stack:  # ']': an empty array closes
            return self.close(at)
        if scan.stack and scan.stack[-1].kind == ARRAY:
            scan.stack[-1].item_start = at
        if byte == 0x7B:  # '{'
            self.opened(OBJECT)
            scan.mode = KEY
        elif byte == 0x5B:  # '['
            self.opened(ARRAY)
            scan.mode = VALUE
        elif byte == 0x22:
            scan.mode, scan.in_key, scan.start = STRING, False, at
        else:
            scan.mode, scan.start = SCALAR, at
            scan.literal = _LITERAL_TAIL.get(byte, 0)
        return True

    def after_value(self, byte: int, at: int) -> bool:
        """After a value: a ``,``, or a ``]`` / ``}`` closing its container."""
        scan = self.scan
        if byte == 0x2C and scan.stack:  # ','
            scan.mode = VALUE if scan.stack[-1].kind == ARRAY else KEY
        elif byte in (0x5D, 0x7D) and scan.stack:  # ']' '}'
            return self.close(at)
        return True

    def key_starts(self, byte: int, at: int) -> bool:
        """Where an object's key may start: it does, or ``}`` closes the object."""
        scan = self.scan
        if byte == 0x22:
            scan.mode, scan.in_key, scan.start = STRING, True, at
        elif byte == 0x7D and scan.stack:
            return self.close(at)
        return True

    def ended(self, end: int) -> bool:
        """A value ended at ``end`` (exclusive): an item of a checked array is reported."""
        scan = self.scan
        scan.mode = AFTER
        if not scan.stack:
            return True
        parent = scan.stack[-1]
        if parent.kind == ARRAY:
            if parent.rules is not None and not self.events.item(
                parent, self.text(parent.item_start, end)
            ):
                return False
            parent.count += 1
        return True

    def opened(self, kind: int) -> None:
        scan = self.scan
        parent = scan.stack[-1] if scan.stack else None
        frame = Frame(kind, frozenset() if parent is None else parent.nodes)
        scan.stack.append(frame)
        self.events.opened(frame, parent)

    def close(self, at: int) -> bool:
        """The innermost container closes at ``at`` (a checked array is reported), and is
        a value that ended there."""
        frame = self.scan.stack.pop()
        if frame.kind == ARRAY and frame.rules is not None and not self.events.closed(frame):
            return False
        return self.ended(at + 1)


@dataclass(frozen=True)
class TokenReach:
    """Per token id, read from the start of a token (``outside``: not in a string; ``inside``: in a
    string, no escape pending): ``*_low``, the lowest nesting level (0 where it starts, a
    string counting as one level) a closing quote or bracket lands on, else ``NO_CLOSE``;
    ``*_bracket``, a ``]``, or a ``[`` with more after it, outside strings (an array closed,
    or opened and perhaps written into); ``outside_bare``, a byte that ends or completes a
    number or literal (``,``, whitespace, ``e``, ``l``) at level 0 or below outside strings;
    ``quiet_close``, a token that from inside a string closes it and then holds only
    whitespace, ``,``, ``]`` or ``}``, perhaps then a quote opening a string (so it
    completes one string and writes nothing of another value), and ``by_prefix``, those
    tokens by the string text (decoded) before their quote; ``scalar_start``, a token of
    number bytes or the start of ``true`` / ``false`` / ``null`` (after any ``,`` and
    whitespace), which may start or extend a scalar item without completing it;
    ``number_next``, a token whose first byte continues a number; ``escaped``,
    ``inside_low`` and ``inside_bracket`` read from inside an escape (``Scan.escape``: just
    after a backslash, or with hex digits of ``\\u`` to come), past the bytes that finish
    it; ``by_bytes``, a token id for each token's bytes."""

    outside_low: np.ndarray
    inside_low: np.ndarray
    outside_bracket: np.ndarray
    inside_bracket: np.ndarray
    outside_bare: np.ndarray
    quiet_close: np.ndarray
    by_prefix: dict[bytes, list[int]]
    scalar_start: np.ndarray
    number_next: np.ndarray
    escaped: dict[int, tuple[np.ndarray, np.ndarray]]
    by_bytes: dict[bytes, int]
    _packed: dict = field(default_factory=dict, compare=False, repr=False)

    def may_complete(
        self, inside: bool, depth: int | None, scalars: bool = False, escape: int = 0
    ) -> np.ndarray:
        """As bitmask words (the matchers' layout), the tokens that may complete an item of
        the array ``depth`` levels out (``None``: no array checked) or close or open an array,
        from inside a string (in an ``escape``) or not; with ``scalars``, also the
        ``scalar_start`` tokens. Built once per (inside, depth, scalars, escape)."""
        key = (inside, depth, scalars, escape)
        words = self._packed.get(key)
        if words is None:
            if escape:
                low, bracket = self.escaped[escape]
            elif inside:
                low, bracket = self.inside_low, self.inside_bracket
            else:
                low, bracket = self.outside_low, self.outside_bracket
            selected = bracket.copy()
            if depth is not None:
                selected |= low <= -depth
                if depth == 0 and not inside:
                    selected |= self.outside_bare
            if scalars:
                selected |= self.scalar_start
            words = self._packed[key] = pack(selected)
        return words

    def packed_quiet(self) -> np.ndarray:
        """``quiet_close`` as bitmask words."""
        words = self._packed.get("quiet")
        if words is None:
            words = self._packed["quiet"] = pack(self.quiet_close)
        return words

    def next_in_number(self) -> np.ndarray:
        """``number_next`` as bitmask words."""
        words = self._packed.get("number_next")
        if words is None:
            words = self._packed["number_next"] = pack(self.number_next)
        return words


def pack(selected: np.ndarray) -> np.ndarray:
    """Booleans per token id as bitmask words (bit ``i % 32`` of word ``i // 32``)."""
    packed = np.packbits(selected, bitorder="little")
    return np.pad(packed, (0, -len(packed) % 4)).view(np.uint32)


_STRUCTURAL = frozenset(b'"[]{}\\')
_BARE = frozenset(b", \t\n\rel")
_STRUCTURAL_BYTES, _BARE_BYTES = byte_set(_STRUCTURAL), byte_set(_BARE)
_SCALAR_CANDIDATE = byte_set(b"0123456789+-.eE, \t\n\rtruefalsenull")  # (and separators)


def token_reach(pieces: list[bytes]) -> TokenReach:
    """``TokenReach`` of every token (tokens with a quote, bracket or backslash read byte by
    byte: about 0.1 s for Qwen's 152k)."""
    size = len(pieces)
    arrays = PieceArrays.of(pieces)
    low = [np.full(size, NO_CLOSE, np.int16) for _ in range(2)]
    bracket = [np.zeros(size, bool) for _ in range(2)]
    bare = arrays.any_in(_BARE_BYTES)  # (tokens without structure: decided by this alone)
    quiet = np.zeros(size, bool)
    by_prefix: dict[bytes, list[int]] = {}
    escaped = {e: (np.full(size, NO_CLOSE, np.int16), np.zeros(size, bool)) for e in _ESCAPES}
    for token_id in np.flatnonzero(arrays.any_in(_STRUCTURAL_BYTES)).tolist():
        piece = pieces[token_id]
        prefix = _quiet_prefix(piece)
        if prefix is not None:
            quiet[token_id] = True
            by_prefix.setdefault(prefix, []).append(token_id)
        for inside in (0, 1):
            lowest, saw_bracket, saw_bare = _reach(piece, bool(inside))
            low[inside][token_id] = lowest
            bracket[inside][token_id] = saw_bracket
            if not inside:
                bare[token_id] = saw_bare
        for escape, (escaped_low, escaped_bracket) in escaped.items():
            skip = escape if escape > 0 else (5 if piece[:1] == b"u" else 1)
            lowest, saw_bracket, _ = _reach(piece[skip:], True)
            escaped_low[token_id], escaped_bracket[token_id] = lowest, saw_bracket
    # Only pieces of number bytes, the literals' letters and leading separators can start a
    # scalar: the others are decided without reading them one by one.
    scalar_start = np.zeros(size, bool)
    for token_id in np.flatnonzero(arrays.all_in(_SCALAR_CANDIDATE) & (arrays.lengths > 0)):
        scalar_start[token_id] = _starts_scalar(pieces[token_id].lstrip(b", \t\n\r"))
    number_next = _NUMBER_NEXT_BYTES[np.maximum(arrays.byte_at(0), 0)] & (arrays.lengths > 0)
    return TokenReach(
        low[0], low[1], bracket[0], bracket[1], bare, quiet, by_prefix, scalar_start,
        number_next, escaped, {p: i for i, p in reversed(list(enumerate(pieces))) if p},
    )  # fmt: skip


_ESCAPES = (-1, 1, 2, 3, 4)  # ``Scan.escape`` values inside a string: after "\\", hex to come


_LITERALS = (b"true", b"false", b"null")


def _starts_scalar(text: bytes) -> bool:
    return bool(text) and (_SCALAR.issuperset(text) or any(w.startswith(text) for w in _LITERALS))


_NUMBER_NEXT_BYTES = byte_set(b"0123456789.eE")
_QUIET_TAIL = frozenset(b" \t\n\r,]}")


def _quiet_prefix(piece: bytes) -> bytes | None:
    """For a token that, read inside a string, closes it and then holds only ``_QUIET_TAIL``
    bytes (and perhaps, last, the quote opening the next string): the string text before
    the quote, decoded (UTF-8 bytes); else ``None``."""
    escape = False
    for at, byte in enumerate(piece):
        if escape:
            escape = False
        elif byte == 0x5C:
            escape = True
        elif byte == 0x22:
            tail = piece[at + 1 :]
            opens = tail.find(b'"')
            if opens >= 0 and tail[opens + 1 :]:  # text of the next item: followed in full
                return None
            if not _QUIET_TAIL.issuperset(tail if opens < 0 else tail[:opens]):
                return None
            raw = piece[:at]
            if 0x5C not in raw:
                return raw
            try:
                return json.loads(b'"' + raw + b'"').encode()
            except ValueError:  # an escape split across tokens, or bytes of half a character
                return None
    return None


def _reach(piece: bytes, inside: bool) -> tuple[int, bool, bool]:
    depth, lowest, saw_bracket, saw_bare, escape = 0, NO_CLOSE, False, False, False
    last = len(piece) - 1
    for at, byte in enumerate(piece):
        if inside:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                inside, depth = False, depth - 1
                lowest = min(lowest, depth)
            continue
        if byte in (0x5B, 0x7B):
            depth += 1
            saw_bracket = saw_bracket or (byte == 0x5B and at < last)  # may open and write
        elif byte in (0x5D, 0x7D):
            depth -= 1
            lowest = min(lowest, depth)
            saw_bracket = saw_bracket or byte == 0x5D
        elif byte == 0x22:
            inside, depth = True, depth + 1
        elif depth <= 0 and byte in _BARE:
            saw_bare = True
    return lowest, saw_bracket, saw_bare
