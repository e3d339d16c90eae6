"""Compiling a spec: now, in this thread (``compile_now``), or off the hot path
(``GrammarCompiler``: the cache, worker threads and a time limit).

``GrammarCompiler.submit`` returns a future at once (a cache hit is already done), so the
processor can start compiles when requests join and collect them when their rows need a
mask. ``compile`` waits at most ``settings().compile_timeout_s`` seconds
(``CONSTRAINED_COMPILE_TIMEOUT_S``); a compile that runs longer is an error for that request
only (it finishes in the background and its result is dropped).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from constrained.grammars.auto import compile_auto, compile_with
from constrained.grammars.backend import CompiledGrammar
from constrained.grammars.cache import CompileCache
from constrained.grammars.errors import GrammarError
from constrained.grammars.registry import AUTO
from constrained.grammars.schema_input import close_objects
from constrained.grammars.size_guard import refuse_huge_regexes
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.vocab import Vocab
from constrained.settings import settings

COMPILE_TIMEOUT_ENV = "CONSTRAINED_COMPILE_TIMEOUT_S"
CACHE_SIZE = 512


def compile_now(spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    """Compile in this thread (no cache, no time limit). ``auto`` picks the backend.

    Raises:
        GrammarError: the constraint is invalid, or no backend enforces all of it.
    """
    if spec.close_objects:
        try:
            spec = dataclasses.replace(spec, source=close_objects(spec.source))
        except ValueError as exc:
            raise GrammarError("", str(exc), keyword="allOf") from None
    refuse_huge_regexes(spec)
    if spec.backend != AUTO:
        return compile_with(spec.backend, spec, vocab)
    return compile_auto(spec, vocab)


class GrammarCompiler:
    """Per-vocabulary compile cache (LRU) with a worker pool."""

    def __init__(self, vocab: Vocab, max_workers: int = 2, cache_size: int = CACHE_SIZE) -> None:
        self.vocab = vocab
        self.cache_size = cache_size
        self._cache = CompileCache(cache_size)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="constrained-compile")

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; a cached one when this spec was seen."""
        return self._cache.get_or_start(
            spec, lambda: self._pool.submit(compile_now, spec, self.vocab)
        )

    def cache_len(self) -> int:
        """Compiles held (done or running); at most ``cache_size``."""
        return len(self._cache)

    def compile(self, spec: GrammarSpec, timeout: float | None = None) -> CompiledGrammar:
        """Compile (or fetch) within ``timeout`` seconds (default: the configured limit).

        Raises:
            GrammarError: invalid or unenforceable constraint, or the time limit passed.
        """
        future = self.submit(spec)
        limit = settings().compile_timeout_s if timeout is None else timeout
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            self._cache.discard(spec, future)  # do not cache a compile nobody waited for
            raise GrammarError(
                spec.backend, f"compiling took longer than {limit:g} s ({COMPILE_TIMEOUT_ENV})"
            ) from None


_COMPILERS: dict[str, GrammarCompiler] = {}
_COMPILERS_LOCK = threading.Lock()


def compiler_for(vocab: Vocab) -> GrammarCompiler:
    """The process-wide compiler of a vocabulary."""
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(vocab.key)
        if compiler is None:
            compiler = _COMPILERS[vocab.key] = GrammarCompiler(vocab)
        return compiler


def describe(compiled: Any) -> str:
    """The name of the backend that compiled ``compiled``."""
    return getattr(compiled, "backend", type(compiled).__name__)
