"""Which output tokens are *content*: the words a model chooses, not the structure a grammar
makes (#56: penalties that spare the structure).

A row (the next token's distribution) is **open** when the model chooses freely there:

- a free row (thinking before a reasoning marker): nothing is masked;
- a masked row that allows at least ``OPEN_SHARE`` of the vocabulary and, for JSON (a
  schema, ``json_object``), lies inside a string *value*: not a key, not between tokens.

So the braces, commas, colons, quotes and keys of JSON are structure, as are enum and const
values and formats (their rows are narrow), and every token the grammar forces (a row of one
token). A token is **content** when it was sampled from an open row and leaves the text
inside the same string value (a token that closes the string is structure).

Pure functions and a byte-level lexer; no tensors, no vLLM. ``open_row`` takes the mask's
popcount, which the mask writer has at hand.

Example::

    lexer = JsonLexer()
    lexer.feed(b'{"name": "Ada')
    lexer.in_value  # True: inside the value of "name"
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# A masked row is open when it allows at least this share of the vocabulary: inside a free
# JSON string nearly every token is allowed (all but the few that end it wrongly); an enum,
# a const, a date format or a number allows a handful.
OPEN_SHARE = 0.25

_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = 0x7B, 0x7D, 0x5B, 0x5D
_COMMA, _COLON = 0x2C, 0x3A


@dataclass
class JsonLexer:
    """Where a JSON text stands, byte by byte: inside a string (a key's or a value's) or
    between tokens. It reads well-formed JSON (the grammar guarantees it) and tracks only
    what tells a key from a value; numbers and literals pass through."""

    containers: bytearray = field(default_factory=bytearray)  # '{' / '[' still open
    in_string: bool = False
    is_key: bool = False  # the string being read is an object key
    escaped: bool = False
    expect_key: bool = False  # the next string opens a key
    strings: int = 0  # strings opened so far: tells "still the same string" apart

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == _BACKSLASH:
                    self.escaped = True
                elif byte == _QUOTE:
                    self.in_string = False
                continue
            if byte == _QUOTE:
                self.in_string, self.is_key = True, self.expect_key
                self.strings += 1
            elif byte in (_OPEN_OBJECT, _OPEN_ARRAY):
                self.containers.append(byte)
                self.expect_key = byte == _OPEN_OBJECT
            elif byte in (_CLOSE_OBJECT, _CLOSE_ARRAY):
                if self.containers:
                    self.containers.pop()
                self.expect_key = False
            elif byte == _COMMA:
                self.expect_key = bool(self.containers) and self.containers[-1] == _OPEN_OBJECT
            elif byte == _COLON:
                self.expect_key = False

    @property
    def in_value(self) -> bool:
        """Inside a string that is a value (in an object, an array or at the top)."""
        return self.in_string and not self.is_key


def open_row(allowed: int, vocab_size: int, in_value: bool | None) -> bool:
    """Whether a masked row is open: it allows at least ``OPEN_SHARE`` of the vocabulary and,
    for JSON (``in_value`` not None), lies inside a string value."""
    return allowed >= OPEN_SHARE * vocab_size and in_value is not False


class ContentTracker:
    """One request's content tokens, in order, as its output is read.

    The writer records the class of each row the request samples from, in order
    (``row_sampled``: its row, then its draft rows); ``read`` then takes each token that
    came, with its bytes, against the row it was sampled from; ``end_step`` drops the rows
    no token came from (rejected drafts). A token from a free (thinking) row is content and
    never reaches the JSON lexer; a token from a masked row is content when the row was open
    and, for JSON, the token stays inside the same string value.
    """

    def __init__(self, json: bool) -> None:
        self.lexer = JsonLexer() if json else None
        self.tokens: list[int] = []  # the content tokens, in order
        self._rows: list[tuple[bool, bool]] = []  # (open, free) of the rows sampled next

    def in_value(self) -> bool | None:
        """For ``open_row``: None when the text is not JSON."""
        return None if self.lexer is None else self.lexer.in_value

    def in_value_after(self, datas: list[bytes]) -> bool | None:
        """``in_value`` once ``datas`` (a draft row's drafts) are read, the lexer unmoved."""
        if self.lexer is None:
            return None
        ahead = replace(self.lexer, containers=bytearray(self.lexer.containers))
        for data in datas:
            ahead.feed(data)
        return ahead.in_value

    def row_sampled(self, open_: bool, free: bool) -> None:
        self._rows.append((open_, free))

    def row_open(self) -> bool:
        """Whether the request's next row (its first this step) is open."""
        return bool(self._rows) and self._rows[0][0]

    def end_step(self) -> None:
        self._rows.clear()

    def read(self, token: int, data: bytes) -> bool:
        """Read one output token; True when it is content (it is then kept)."""
        opened, free = self._rows.pop(0) if self._rows else (False, False)
        if free or self.lexer is None:
            content = opened
        else:
            strings, was_in_value = self.lexer.strings, self.lexer.in_value
            self.lexer.feed(data)
            content = (
                opened and was_in_value and self.lexer.in_value and self.lexer.strings == strings
            )
        if content:
            self.tokens.append(token)
        return content
