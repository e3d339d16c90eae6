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

    The writer records the class of each row the request may sample from, by the output
    position of the token sampled there (``row_sampled``: its row at the position it has
    read to, a draft row ``k`` drafts further); ``read`` then takes each output token, with
    its bytes, against the row recorded at its position. The latest record at a position
    is the row its token was sampled from (a token is committed in the step that recorded
    it), so rejected drafts, discarded chunk samples and a preempted run's last step need no
    bookkeeping. A token from a free (thinking) row is content and never reaches the JSON
    lexer; from a masked row it is content when the row was open and, for JSON, the token
    stays inside the same string value.
    """

    def __init__(self, json: bool) -> None:
        self.lexer = JsonLexer() if json else None
        self.tokens: list[int] = []  # the content tokens, in order
        self.read_count = 0  # output tokens read: the position of the next one
        self._rows: dict[int, tuple[bool, bool]] = {}  # position -> (open, free)
        self.whitespace_run = 0  # whitespace-only tokens read since the last other token
        # The request's (repetition, frequency, presence), when its structure rows damp
        # whitespace (``damps_whitespace``); None: they are left alone.
        self.damping: tuple[float, float, float] | None = None

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

    def row_sampled(self, position: int, open_: bool, free: bool) -> None:
        """The row whose sample becomes output token ``position``."""
        if position >= self.read_count:  # (a resumed run's rows before its tokens: stale)
            self._rows[position] = (open_, free)

    def row_open(self, k: int = 0) -> bool:
        """Whether the row after ``k`` drafts (0: the request's row) is open."""
        return self._rows.get(self.read_count + k, (False, False))[0]

    def drafts_content(self, datas: list[bytes]) -> list[bool]:
        """Whether each draft fed this step (their bytes, in order) would be content, read
        as ``read`` would read it; nothing is kept."""
        lexer = None
        if self.lexer is not None:
            lexer = replace(self.lexer, containers=bytearray(self.lexer.containers))
        out = []
        for j, data in enumerate(datas):
            opened, free = self._rows.get(self.read_count + j, (False, False))
            out.append(opened if (free or lexer is None) else _stays_in_value(lexer, data, opened))
        return out

    def run_after(self, datas: list[bytes]) -> int:
        """The whitespace run once ``datas`` (a row's drafts) are read."""
        run = self.whitespace_run
        for data in datas:
            run = run + 1 if is_whitespace(data) else 0
        return run

    def read(self, token: int, data: bytes) -> bool:
        """Read the next output token; True when it is content (it is then kept)."""
        opened, free = self._rows.pop(self.read_count, (False, False))
        self.read_count += 1
        self.whitespace_run = self.whitespace_run + 1 if is_whitespace(data) else 0
        if free or self.lexer is None:
            content = opened
        else:
            content = _stays_in_value(self.lexer, data, opened)
        if content:
            self.tokens.append(token)
        return content

    def end_step(self) -> None:
        """Forget rows of positions already read (stale records)."""
        for position in [p for p in self._rows if p < self.read_count]:
            del self._rows[position]


def is_whitespace(data: bytes) -> bool:
    """A token made of JSON whitespace only (space, tab, newline, carriage return)."""
    return bool(data) and not data.strip(b" \t\n\r")


def _stays_in_value(lexer: JsonLexer, data: bytes, opened: bool) -> bool:
    """Feed ``data`` to ``lexer``; True when its row was open and it starts and ends inside
    the same string value."""
    strings, was_in_value = lexer.strings, lexer.in_value
    lexer.feed(data)
    return opened and was_in_value and lexer.in_value and lexer.strings == strings
