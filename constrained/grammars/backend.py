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
    from constrained.errors import GrammarError
    from constrained.grammars.matcher import Matcher
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab


class CompiledGrammar(Protocol):
    """A checked grammar of one backend; each request gets its own ``matcher()``."""

    backend: str
    #: Whether a matcher's rows depend on more than the grammar's state (the items an array
    #: saw: ``checked_matcher.CheckedGrammar``); then closing's checks of a row are not
    #: shared between requests (``closing_tables.ClosingTables.sorts``).
    history: bool
    #: What closing keeps of the grammar (root witness, rise, shared sorts), set on first
    #: use by ``closing_tables.tables_of``.
    closing_tables: Any
    #: The store and key it is kept under (``GrammarCompiler``), where closing keeps its
    #: tables for other processes; absent for a grammar compiled without a store.
    stored_as: Any

    def matcher(self) -> Matcher: ...


def library_version(distribution: str) -> Callable[[], str]:
    """``Backend.version`` for a backend that is the installed package ``distribution``."""

    def version() -> str:
        from importlib.metadata import version as installed

        return f"{distribution}=={installed(distribution)}"

    return version


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
        version: the installed library's version; part of a stored grammar's key, so a
            grammar compiled by another version is never loaded.
        dump: ``compiled -> bytes``, what the store keeps of a compiled grammar.
        load: ``(bytes, vocab) -> CompiledGrammar``, the inverse, without compiling again;
            raises on bytes it cannot read (the store then compiles).
        store_after_s: store a compiled grammar only when its compile took at least this
            long; below it, compiling again is cheaper than ``dump`` plus ``load``.
        kinds: the ``GrammarSpec.kind`` values it compiles (``auto`` skips it for others).
    """

    name: str
    compile: Callable[[GrammarSpec, Vocab], CompiledGrammar]
    version: Callable[[], str]
    dump: Callable[[Any], bytes]
    load: Callable[[bytes, Vocab], CompiledGrammar]
    refusal: Callable[[Any], tuple[str, str] | None] = refuses_nothing
    refused_keyword: Callable[[GrammarError], str | None] = keyword_attribute
    store_after_s: float = 0.0
    kinds: frozenset[str] = frozenset({"json_schema", "regex", "grammar"})

    def refuse_unenforced(self, schema: Any, where: str = "") -> None:
        """Raise ``GrammarError`` naming the first keyword of ``schema`` (parsed) this backend
        would not enforce, if any; ``where``: the schema's place in a larger constraint."""
        from constrained.errors import GrammarError

        found = self.refusal(schema)
        if found:
            keyword, path = found
            message = f"does not enforce keyword '{keyword}' (at {where}{path})"
            raise GrammarError(self.name, message, keyword=keyword)
