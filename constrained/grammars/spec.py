"""What a request asks its output to match, as one hashable value (also the cache key)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "regex", "grammar"]
Whitespace = Literal["compact", "flexible"]

DEFAULT_MAX_WHITESPACE = 2  # characters after each ',' / ':' in flexible JSON


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint: its kind, its source text, the backend asked for and JSON whitespace.

    ``source`` is the JSON-schema text, the regex, or the grammar (GBNF ``root ::= ...``, or
    Lark for llguidance). ``backend`` is ``auto`` or a backend's name
    (``registry.BACKEND_NAMES``). ``whitespace`` applies to JSON schemas only: ``compact``
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
