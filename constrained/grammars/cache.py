"""The bounded LRU cache of compiles: one future per ``GrammarSpec``, running or done.

Holding futures rather than results lets a second request with the same constraint wait on
the compile the first one started. Thread-safe; the oldest entry goes when a new one would
make more than ``size``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

from constrained.grammars.spec import GrammarSpec


class CompileCache:
    """At most ``size`` compile futures, least recently used first out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._futures: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_start(self, spec: GrammarSpec, start: Callable[[], Future]) -> Future:
        """The cached future of ``spec`` (now most recently used), else ``start()``'s, kept."""
        with self._lock:
            future = self._futures.get(spec)
            if future is not None:
                self._futures.move_to_end(spec)
                return future
            future = start()
            self._futures[spec] = future
            while len(self._futures) > self.size:
                self._futures.popitem(last=False)
        return future

    def discard(self, spec: GrammarSpec, future: Future) -> None:
        """Forget ``spec`` if ``future`` is still the one cached for it."""
        with self._lock:
            if self._futures.get(spec) is future:
                del self._futures[spec]

    def __len__(self) -> int:
        """Compiles held (done or running); at most ``size``."""
        with self._lock:
            return len(self._futures)
