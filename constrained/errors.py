"""The one error a grammar layer raises for a request's constraint."""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint cannot be compiled or enforced; ``backend`` says which backend said so."""

    def __init__(self, backend: str, message: str, keyword: str | None = None) -> None:
        self.backend = backend
        self.keyword = keyword
        self.reason = message
        super().__init__(f"{backend}: {message}" if backend else message)
