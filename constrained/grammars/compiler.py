"""Compiling a spec: now, in this thread (``compile_now``), or off the hot path
(``GrammarCompiler``: the cache, the compiled-grammar store, worker threads and a time limit).

``GrammarCompiler.submit`` returns a future at once (a cache hit is already done), so the
processor can start compiles when requests join and collect them when their rows need a
mask. ``compile`` waits at most ``settings().compile_timeout_s`` seconds
(``CONSTRAINED_COMPILE_TIMEOUT_S``); a compile that runs longer is an error for that request
only (it finishes in the background; the in-process cache drops it, the store keeps it).

Compile once: a spec missing from the in-process cache is first looked up in the store
(``store.py``, ``CONSTRAINED_GRAMMAR_STORE``), where admission saved it in the frontend
process; only a miss compiles, and saves what it compiled before the future completes, so a
request admitted is always found by the engine that receives it (unless its backend's
``store_after_s`` says the compile was quicker to repeat than to store and load).
``compiled`` and ``loaded`` count each; the engine's stats report them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from constrained.errors import GrammarError
from constrained.grammars.auto import compile_auto, compile_with
from constrained.grammars.backend import CompiledGrammar
from constrained.grammars.cache import CompileCache
from constrained.grammars.checked_matcher import unwrapped, with_checks
from constrained.grammars.registry import AUTO, BACKENDS, get_backend
from constrained.grammars.size_guard import refuse_huge_regexes
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.store import GrammarStore, store_key
from constrained.grammars.vocab import Vocab
from constrained.helper_cpus import leave_compute_cpus
from constrained.schema.user_input import close_objects
from constrained.settings import settings

logger = logging.getLogger(__name__)

COMPILE_TIMEOUT_ENV = "CONSTRAINED_COMPILE_TIMEOUT_S"
CACHE_SIZE = 512


def compile_now(spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    """Compile in this thread (no cache, no time limit). ``auto`` picks the backend.

    Raises:
        GrammarError: the constraint is invalid, or no backend enforces all of it.
    """
    spec = _as_compiled(spec)
    refuse_huge_regexes(spec)
    if spec.backend != AUTO:
        return compile_with(spec.backend, spec, vocab)
    return compile_auto(spec, vocab)


def _as_compiled(spec: GrammarSpec) -> GrammarSpec:
    """``spec`` with ``close_objects`` applied to its schema (a structural tag's: inside)."""
    if spec.close_objects and spec.kind == "json_schema":
        try:
            return dataclasses.replace(spec, source=close_objects(spec.source))
        except ValueError as exc:
            raise GrammarError("", str(exc), keyword="allOf") from None
    return spec


@functools.cache
def code_fingerprint() -> str:
    """A SHA-256 of this package's grammar and schema code (the rewrites and refusal rules)
    and the backends' versions: a stored grammar from other rules or another backend
    version is never loaded."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in sorted([*here.glob("*.py"), *(here.parent / "schema").glob("*.py")]):
        digest.update(path.read_bytes())
    for backend in BACKENDS:
        digest.update(backend.version().encode())
    return digest.hexdigest()


def default_store() -> GrammarStore | None:
    """The store the settings name, or None when it is off."""
    config = settings()
    if config.grammar_store is None:
        return None
    return GrammarStore(config.grammar_store, config.grammar_store_mb * 1024 * 1024)


class GrammarCompiler:
    """Per-vocabulary compile cache (LRU) with a worker pool, over the compiled-grammar store.

    Attributes:
        compiled: grammars this process compiled.
        loaded: grammars it loaded from the store instead.
    """

    def __init__(
        self,
        vocab: Vocab,
        max_workers: int = 2,
        cache_size: int = CACHE_SIZE,
        store: GrammarStore | None = None,
    ) -> None:
        self.vocab = vocab
        self.cache_size = cache_size
        self.store = store
        self.compiled = 0
        self.loaded = 0
        self._counts_lock = threading.Lock()  # two compile workers count at once
        self._cache = CompileCache(cache_size)
        self._pool = ThreadPoolExecutor(
            max_workers, thread_name_prefix="constrained-compile", initializer=leave_compute_cpus
        )

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; a cached one when this spec was seen."""
        start = lambda: self._pool.submit(self._load_or_compile, spec)  # noqa: E731
        return self._cache.get_or_start(spec, start)

    def _load_or_compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if self.store is None:
            compiled = compile_now(spec, self.vocab)
            self._count(loaded=False)
            return compiled
        key = self.key_of(spec)
        grammar = self._load(spec, key, self.store)
        if grammar is None:
            start = time.perf_counter()
            grammar = compile_now(spec, self.vocab)
            self._count(loaded=False)
            backend = get_backend(grammar.backend)
            if time.perf_counter() - start >= backend.store_after_s:
                self.store.save(key, backend.name, backend.dump(unwrapped(grammar)))
        grammar.stored_as = (self.store, key)  # closing keeps its tables beside it
        return grammar

    def key_of(self, spec: GrammarSpec) -> str:
        """The store key of ``spec``'s compiled grammar (its tables are kept beside it)."""
        return store_key(code_fingerprint(), self.vocab.fingerprint(), repr(spec))

    def _load(self, spec: GrammarSpec, key: str, store: GrammarStore) -> Any:
        """The grammar stored under ``key``, or ``None``."""
        found = store.load(key)
        if found is None:
            return None
        name, payload = found
        try:
            grammar = get_backend(name).load(payload, self.vocab)
            grammar = with_checks(_as_compiled(spec), grammar, self.vocab)
        except Exception as exc:  # unreadable for this backend: compile it again
            logger.warning("constrained: a stored %s grammar did not load (%s)", name, exc)
            return None
        self._count(loaded=True)
        return grammar

    def _count(self, loaded: bool) -> None:
        with self._counts_lock:
            if loaded:
                self.loaded += 1
            else:
                self.compiled += 1

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


def _forget_compilers() -> None:
    """In a forked child (vLLM's engine core, by default where CUDA is not initialised): none
    of the compile pools' threads are there, nor whichever thread held the lock, so the
    child starts compilers of its own."""
    global _COMPILERS_LOCK
    _COMPILERS.clear()
    _COMPILERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_compilers)


def compiler_for(vocab: Vocab) -> GrammarCompiler:
    """The process-wide compiler of a vocabulary."""
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(vocab.key)
        if compiler is None:
            compiler = _COMPILERS[vocab.key] = GrammarCompiler(vocab, store=default_store())
        return compiler


def describe(compiled: Any) -> str:
    """The name of the backend that compiled ``compiled``."""
    return getattr(compiled, "backend", type(compiled).__name__)
