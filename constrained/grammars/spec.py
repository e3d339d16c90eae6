"""What a request asks its output to match, as one hashable value (also the cache key)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "regex", "grammar", "structural_tag"]
Whitespace = Literal["compact", "flexible"]

DEFAULT_MAX_WHITESPACE = 2  # characters after each ',' / ':' in flexible JSON


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint: its kind, its source text, the backend asked for and JSON whitespace.

    ``source`` is the JSON-schema text, the regex, the grammar (GBNF ``root ::= ...``, or
    Lark for llguidance), or the structural tag (``structural_tag.py``: xgrammar's JSON).
    ``backend`` is ``auto`` or a backend's name (``registry.BACKEND_NAMES``).
    ``whitespace`` applies to JSON (schemas, and a structural tag's): ``compact``
    allows no whitespace between tokens; ``flexible`` allows up to ``max_whitespace`` spaces,
    newlines or tabs after each ``,`` and ``:``, so output can never run away with whitespace.
    ``close_objects`` adds ``"additionalProperties": false`` to object schemas that say
    nothing about extra keys.
    """

    kind: GrammarKind
    source: str
    backend: str = "auto"
    whitespace: Whitespace = "compact"
    max_whitespace: int = DEFAULT_MAX_WHITESPACE
    close_objects: bool = False


# Characters a regex may take literally in every backend's syntax (llguidance and xgrammar:
# Rust-like; outlines: Python's); every other printable ASCII character is escaped with a
# backslash, which all three read as that character.
_LITERAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _")
_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def choice_regex(choices: list[str]) -> str:
    r"""A regex matching exactly one of ``choices`` (the ``choice`` option).

    >>> choice_regex(["yes", "no (maybe)"])
    '(yes|no \\(maybe\\))'
    """

    def escape(char: str) -> str:
        if char in _LITERAL or ord(char) > 127:
            return char
        if char in _CONTROL:
            return _CONTROL[char]
        if not char.isprintable():
            raise ValueError(f"control character {char!r} is not supported in a choice")
        return "\\" + char

    return "(" + "|".join("".join(escape(c) for c in choice) for choice in choices) + ")"
