"""Ending a process tree by its session: a test's subprocess started with
``start_new_session=True`` and everything it started (unless that called ``setsid`` itself).

Used by ``tests/ray_cluster.py`` (each Ray node's ``ray start`` and its raylet, GCS and
workers) and ``tests/test_parallel.py``'s ``run_layout`` (the runner and vLLM's engine process,
which outlives a runner that is killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def session_pids(sid: int) -> list[int]:
    """The live processes of the session ``sid``; exited ones not yet reaped (zombies) are
    not counted."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
            # /proc/PID/stat: "pid (comm) state ..."; comm may hold spaces and parentheses.
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, PermissionError, FileNotFoundError, IndexError):
            continue
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def kill_sessions(sids: list[int], timeout: float = 30) -> list[int]:
    """SIGKILL every process of the sessions ``sids`` until none is left (again each round:
    one may have started another meanwhile). Returns those still alive after ``timeout``.
    The caller reaps its own children (``Popen.wait``); others are reparented and reaped."""
    deadline = time.monotonic() + timeout
    while (left := [pid for sid in sids for pid in session_pids(sid)]) and (
        time.monotonic() < deadline
    ):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return left
