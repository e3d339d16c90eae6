"""Optional state snapshots from the engine process, for soak tests and operators.

With ``CONSTRAINED_STATS_PATH=/some/file.json`` set in the server's environment, the engine
process rewrites that file (atomically, at most once per ``CONSTRAINED_STATS_INTERVAL_S``,
default 1 s, from the batch-update hook) with what our processors hold: per processor, the
slots in use and the per-request objects kept; the compile cache's entries; the process's
resident memory. Unset (the default), it costs one attribute check per step.

In a parallel engine each worker writes its own file, named after its place
(``placement.py``): ``engine_stats.json`` becomes ``engine_stats.dp0-pp1-tp0.json``.

Example snapshot::

    {"pid": 4242, "time": 1763700000.0, "rss_mb": 1830.5,
     "processors": {"GrammarMaskProcessor": {"active_slots": 3, "payloads": 3, "capacity": 64}},
     "compile_cache": {"entries": 17, "capacity": 512, "compiled": 0, "loaded": 17},
     "vocab_from_record": true, "compile_waits": {"count": 2, "seconds": 0.061, "started": 5}}
"""

from __future__ import annotations

import inspect
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

from constrained.grammars.stack import COMPILE_WAITS
from constrained.settings import settings


class StatsReporter:
    """Collects the live processors of this process and writes their snapshot when due.

    ``path`` / ``interval_s`` default to the settings, read when the first processor of the
    process registers.
    """

    def __init__(self, path: str | None = None, interval_s: float | None = None) -> None:
        self.path = path
        self.interval_s = interval_s
        self._processors: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last = 0.0
        self._configured = path is not None
        self.worker = ""

    def _configure(self, worker_tag: str) -> None:
        if not self._configured:
            self._configured = True
            self.path = settings().stats_path
            if self.path and worker_tag:  # one file per worker of a parallel engine
                path = Path(self.path)
                self.path = str(path.with_name(f"{path.stem}.{worker_tag}{path.suffix}"))
            self.worker = worker_tag
            if self.interval_s is None:
                self.interval_s = settings().stats_interval_s

    def register(self, processor: Any, worker_tag: str = "") -> None:
        """Track ``processor``; ``worker_tag`` names this worker of a parallel engine."""
        self._configure(worker_tag)
        if self.path:
            self._processors.add(processor)

    def tick(self) -> None:
        """Write the snapshot if the interval has passed (cheap no-op when disabled)."""
        if not self.path:
            return
        now = time.monotonic()
        if now - self._last < (self.interval_s or 0.0):
            return
        self._last = now
        self.write()

    def snapshot(self) -> dict[str, Any]:
        processors: dict[str, Any] = {}
        caches: dict[int, Any] = {}
        for proc in list(self._processors):
            slots = proc.slots
            processors[type(proc).__name__] = {
                "active_slots": int(slots.active.sum()),
                "payloads": sum(p is not None for p in slots.payload),
                "capacity": slots.capacity,
            }
            # (statically: a plain read would build the grammar processor's lazy parts)
            compiler = inspect.getattr_static(proc, "compiler", None)
            if compiler is not None:
                caches[id(compiler)] = compiler
        entries = sum(c.cache_len() for c in caches.values())
        capacity = sum(c.cache_size for c in caches.values())
        return {
            "pid": os.getpid(),
            "worker": self.worker,
            "time": time.time(),
            "rss_mb": _rss_mb(),
            "processors": processors,
            "compile_cache": {
                "entries": entries,
                "capacity": capacity,
                # compiled here vs loaded from the store (what admission compiled)
                "compiled": sum(c.compiled for c in caches.values()),
                "loaded": sum(c.loaded for c in caches.values()),
            },
            # the vocabulary built from the tokenizer's record, not a second tokenizer load
            "vocab_from_record": any(c.vocab.from_record for c in caches.values()),
            # rows whose answer's first mask waited for a compile still running, and rows
            # whose first row was admission's instead (their next row may still wait)
            "compile_waits": {
                "count": COMPILE_WAITS.count,
                "seconds": round(COMPILE_WAITS.seconds, 4),
                "started": COMPILE_WAITS.started,
            },
        }

    def write(self) -> None:
        assert self.path is not None
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.snapshot(), f)
        os.replace(tmp, self.path)


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError):  # not Linux
        return -1.0


REPORTER = StatsReporter()
