"""Compile constraints off the hot path: a bounded cache, worker threads and a time limit.

``GrammarCompiler.submit`` returns a future at once (a cache hit is already done), so the
processor can start compiles when requests join and collect them when their rows need a
mask. ``compile`` waits at most ``timeout`` seconds; a compile that runs longer is an error
for that request only (it finishes in the background and its result is dropped).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from constrained.grammars.errors import GrammarError
from constrained.grammars.llguidance_backend import LLGuidanceGrammar
from constrained.grammars.outlines_backend import OutlinesGrammar
from constrained.grammars.regex_size import regex_size_problem
from constrained.grammars.schema_input import close_objects
from constrained.grammars.schema_support import iter_subschemas, unsupported_keyword
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.vocab import Vocab
from constrained.grammars.xgrammar_backend import XGrammarGrammar

COMPILE_TIMEOUT_ENV = "CONSTRAINED_COMPILE_TIMEOUT_S"
DEFAULT_COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 512

_GRAMMARS = {
    "llguidance": LLGuidanceGrammar,
    "xgrammar": XGrammarGrammar,
    "outlines": OutlinesGrammar,
}
# auto: llguidance first (it refuses what it cannot enforce), then the others where they
# enforce every keyword the schema uses.
AUTO_ORDER = ("llguidance", "xgrammar", "outlines")

CompiledGrammar = LLGuidanceGrammar | XGrammarGrammar | OutlinesGrammar


def compile_timeout() -> float:
    return float(os.environ.get(COMPILE_TIMEOUT_ENV, DEFAULT_COMPILE_TIMEOUT_S))


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
    _refuse_huge_regexes(spec)
    if spec.backend != "auto":
        return _compile_with(spec.backend, spec, vocab)
    errors: list[GrammarError] = []
    for backend in AUTO_ORDER:
        try:
            return _compile_with(backend, spec, vocab)
        except GrammarError as exc:
            errors.append(exc)
    # llguidance (tried first) enforces the most; its reason leads, the others follow.
    reasons = "; ".join(str(e) for e in errors)
    keyword = _keyword_named(str(errors[0])) if spec.kind == "json_schema" else None
    if keyword is not None:
        raise GrammarError(
            "", f"keyword '{keyword}' is not enforced by any backend ({reasons})", keyword=keyword
        )
    raise GrammarError("", f"cannot be compiled ({reasons})")


def _refuse_huge_regexes(spec: GrammarSpec) -> None:
    """A regex (or a schema's ``pattern``) too big to unroll is refused for every backend."""
    if spec.kind == "regex":
        problem = regex_size_problem(spec.source)
        if problem:
            raise GrammarError("", problem)
    elif spec.kind == "json_schema":
        for path, sub in iter_subschemas(json.loads(spec.source)):
            patterns = [sub.get("pattern"), *(sub.get("patternProperties") or {})]
            for pattern in patterns:
                problem = isinstance(pattern, str) and regex_size_problem(pattern)
                if problem:
                    raise GrammarError("", f"'pattern' at {path} {problem}", keyword="pattern")


def _keyword_named(message: str) -> str | None:
    """The JSON-schema keyword an llguidance refusal names ('Unimplemented keys: ["not"]')."""
    found = re.search(r'[Uu]nimplemented keys?:?\s*\[?"([^"]+)"', message)
    return found.group(1) if found else None


def _compile_with(backend: str, spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    if spec.kind == "json_schema":
        found = unsupported_keyword(json.loads(spec.source), backend)
        if found:
            keyword, path = found
            raise GrammarError(
                backend, f"does not enforce keyword '{keyword}' (at {path})", keyword=keyword
            )
    return _GRAMMARS[backend](spec, vocab)


class GrammarCompiler:
    """Per-vocabulary compile cache (LRU) with a worker pool."""

    def __init__(self, vocab: Vocab, max_workers: int = 2, cache_size: int = CACHE_SIZE) -> None:
        self.vocab = vocab
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="constrained-compile")

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; a cached one when this spec was seen."""
        with self._lock:
            future = self._cache.get(spec)
            if future is not None:
                self._cache.move_to_end(spec)
                return future
            future = self._pool.submit(compile_now, spec, self.vocab)
            self._cache[spec] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return future

    def cache_len(self) -> int:
        """Compiles held (done or running); at most ``cache_size``."""
        with self._lock:
            return len(self._cache)

    def compile(self, spec: GrammarSpec, timeout: float | None = None) -> CompiledGrammar:
        """Compile (or fetch) within ``timeout`` seconds.

        Raises:
            GrammarError: invalid or unenforceable constraint, or the time limit passed.
        """
        future = self.submit(spec)
        limit = compile_timeout() if timeout is None else timeout
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            with self._lock:  # do not cache a compile nobody waited for
                if self._cache.get(spec) is future:
                    del self._cache[spec]
            raise GrammarError(
                spec.backend, f"compiling took longer than {limit:g} s ({COMPILE_TIMEOUT_ENV})"
            ) from None

    def __len__(self) -> int:
        return len(self._cache)


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
    return getattr(compiled, "backend", type(compiled).__name__)
