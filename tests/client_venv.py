"""A virtual environment of its own for a client library that cannot be installed beside
vLLM (instructor 1.17 declares ``jiter<0.15``; the openai vLLM needs wants ``jiter>=0.16``).
Made once from a requirements file of exact pins (``python -m venv``, then its own pip; about
15-40 s with a network), kept in pytest's cache and made again when the pins or the
interpreter change. The client runs in it as a subprocess and only speaks HTTP to the
session's server, so the two environments never meet.

A failure here is an error of the tests that need it, never a skip: CI must run them."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path


def pins(requirements: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file, names lower-case with ``-``."""
    found = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def client_env() -> dict[str, str]:
    """The environment for the venv's processes: nothing of this one's Python paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=client_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n"
                           f"{(out.stdout + out.stderr)[-4000:]}")  # fmt: skip


def client_venv(root: Path, requirements: Path) -> Path:
    """The python of the venv under ``root`` with ``requirements`` installed; made (under a
    lock: sessions may share a checkout) only when missing or made from other pins or by
    another interpreter."""
    key = hashlib.sha256(
        requirements.read_bytes() + f"\n{sys.version}\n{Path(sys.executable).resolve()}".encode()
    ).hexdigest()
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    venv, stamp = root / "venv", root / "stamp"
    python = venv / "bin" / "python"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == key and python.is_file():
            return python
        stamp.unlink(missing_ok=True)
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "-r", str(requirements)])  # fmt: skip
        stamp.write_text(key)
    return python
