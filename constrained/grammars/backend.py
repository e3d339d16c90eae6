"""What a grammar backend plugs in: its name, its compile entry point and its refusals.

A backend module (``llguidance_backend.py`` ...) defines ``BACKEND = Backend(...)`` and is
listed once in ``registry.py``; nothing else names it. ``compile`` turns a ``GrammarSpec`` into
a ``CompiledGrammar`` (raising ``GrammarError``); ``refusal`` says, before any compile, which
keyword of a JSON schema the backend would not enforce, for backends that silently ignore
what they do not implement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from constrained.grammars.errors import GrammarError
    from constrained.grammars.matcher import Matcher
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab


class CompiledGrammar(Protocol):
    """A checked grammar of one backend; each request gets its own ``matcher()``."""

    backend: str

    def matcher(self) -> Matcher: ...


def refuses_nothing(schema: Any) -> tuple[str, str] | None:
    """For a backend that refuses, itself and by name, every keyword it does not enforce."""
    return None


def keyword_attribute(error: GrammarError) -> str | None:
    """The keyword a refusal names, as ``GrammarError.keyword`` carries it."""
    return error.keyword


@dataclass(frozen=True)
class Backend:
    """One grammar backend.

    Attributes:
        name: what ``grammar_backend`` / ``GrammarSpec.backend`` calls it.
        compile: ``(spec, vocab) -> CompiledGrammar``; raises ``GrammarError``.
        refusal: ``(parsed JSON schema) -> (keyword, JSON pointer)`` of the first keyword
            the backend would not enforce, else ``None``; checked before ``compile``.
        refused_keyword: the JSON-schema keyword one of its compile errors names, if any
            (``auto`` names it when no backend enforces a schema).
    """

    name: str
    compile: Callable[[GrammarSpec, Vocab], CompiledGrammar]
    refusal: Callable[[Any], tuple[str, str] | None] = refuses_nothing
    refused_keyword: Callable[[GrammarError], str | None] = keyword_attribute
