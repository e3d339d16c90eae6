"""The compiled-grammar store: compiled grammars on disk, shared by every process of a server.

Admission (vLLM's frontend process) compiles each constraint; the engine process needs the same
compiled grammar moments later. The store carries it across: admission saves what it compiled,
the engine loads it instead of compiling again (xgrammar: a load is about 5% of the compile;
llguidance and outlines-core: milliseconds). It also survives restarts. The same way, the
first process with the served tokenizer saves its record, and a worker without it reads that
(``vocab_record.py``).

One file per compiled grammar, named by its key (a SHA-256 of the constraint, the backend's
version and the tokenizer's fingerprint), holding a one-line JSON header (format, key, backend,
payload size and SHA-256) and the backend's payload (``Backend.dump``). Safe by construction:

- **concurrent writers**: a file is written under a temporary name and renamed into place, so
  a reader sees a whole file or none; two writers of one key write the same bytes;
- **corrupt or foreign entries**: a file whose header, size or checksum does not match is
  deleted and reported as a miss: the caller compiles, nothing read is trusted unchecked;
- **bounded**: after each save, the least recently used files (a hit touches its file) go
  until the store holds at most ``max_bytes``; a payload over a quarter of that is not kept;
- **private**: the directory (``CONSTRAINED_GRAMMAR_STORE``, by default in the user's cache
  directory) is created ``0700``; a store directory that is a link, owned by another user, or
  writable by group or others is refused (``StoreError``, naming the setting), so a store
  shared by a server's processes is no way in; its subdirectories and files are created
  ``0700`` / ``0600`` and never followed through a link (``O_NOFOLLOW``, ``lstat``).

Example::

    >>> store = GrammarStore(Path("/tmp/grammars"), max_bytes=1 << 30)
    >>> store.save("ab12...", "xgrammar", payload)
    >>> store.load("ab12...")
    ('xgrammar', b'...')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".grammar"


SETTING = "CONSTRAINED_GRAMMAR_STORE"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class StoreError(ValueError):
    """The store directory is not private to this user (names the setting)."""


def private_directory(directory: Path) -> Path:
    """``directory``, created ``0700`` if absent; refused unless it is a real directory (not
    a link) owned by this user and writable by nobody else.

    Raises:
        StoreError: naming ``CONSTRAINED_GRAMMAR_STORE`` and what is wrong.
    """
    directory = Path(directory).absolute()
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        found = os.lstat(directory)
    except OSError as exc:
        raise StoreError(f"{SETTING}: cannot create the grammar store {directory}: {exc}") from None
    why = None
    if stat.S_ISLNK(found.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(found.st_mode):
        why = "is not a directory"
    elif hasattr(os, "geteuid") and found.st_uid != os.geteuid():
        why = f"is owned by another user (uid {found.st_uid})"
    elif found.st_mode & 0o022:
        why = f"is writable by group or others (mode {stat.S_IMODE(found.st_mode):o})"
    if why is not None:
        raise StoreError(
            f"{SETTING}: the compiled-grammar store {directory} {why}; another user could "
            "plant grammars the server would load. Point it at a private directory (created "
            f"0700 if absent), fix the directory (chmod 700), or set {SETTING}=off."
        )
    return directory


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


class GrammarStore:
    """Compiled grammars as files under ``directory``, at most ``max_bytes`` in all (after
    each prune; a process's saves past its last prune are pruned once they may pass it).

    Raises:
        StoreError: ``directory`` is not private (``private_directory``).
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = private_directory(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # one prune at a time in this process
        # What this process knows of the stored bytes: the last prune's total (None before
        # the first) and what it saved since. A save prunes only when that may pass the
        # bound, or after an eighth of it was written (other processes write too): a scan
        # of the whole store after each save cost a new schema 5 ms with 64 files stored.
        self._scanned: int | None = None
        self._saved_since = 0

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}{SUFFIX}"

    def load(self, key: str) -> tuple[str, bytes] | None:
        """``(backend, payload)`` stored under ``key``; None if absent or not intact."""
        path = self._path(key)
        if not _real_dir(path.parent):
            return None  # absent, or a link: never followed
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd, "rb") as file:
                if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                    return None
                data = file.read()
        except OSError:
            return None
        header_line, _, payload = data.partition(b"\n")
        try:
            header = json.loads(header_line)
            intact = (
                header["format"] == FORMAT
                and header["key"] == key
                and header["size"] == len(payload)
                and header["sha256"] == hashlib.sha256(payload).hexdigest()
            )
            backend = str(header["backend"])
        except (ValueError, KeyError, TypeError):
            intact = False
        if not intact:
            logger.warning("constrained: discarding a damaged compiled grammar %s", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used: pruned last
        return backend, payload

    def has(self, key: str) -> bool:
        """Whether a file is stored under ``key`` (not read, so not checked: ``load`` is)."""
        path = self._path(key)
        return _real_dir(path.parent) and os.path.isfile(path) and not os.path.islink(path)

    def save(self, key: str, backend: str, payload: bytes) -> bool:
        """Keep ``payload`` under ``key``; False when it is too large or the disk refused."""
        if len(payload) > self.max_bytes // 4:
            return False
        header = {
            "format": FORMAT,
            "key": key,
            "backend": backend,
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        head = json.dumps(header).encode() + b"\n"
        path = self._path(key)
        try:
            with contextlib.suppress(FileExistsError):
                path.parent.mkdir(mode=0o700)
            if not _real_dir(path.parent):
                raise OSError(f"{path.parent} is not a directory of the store")
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=SUFFIX)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(head)
                    out.write(payload)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            logger.warning("constrained: cannot store a compiled grammar in %s (%s)", path, exc)
            return False
        with self._lock:
            self._saved_since += len(head) + len(payload)
            due = (
                self._scanned is None
                or self._scanned + self._saved_since > self.max_bytes
                or self._saved_since >= self.max_bytes // 8
            )
        if due:
            self.prune()
        return True

    def entries(self) -> list[os.DirEntry]:
        """The stored files (temporary ones of writers in progress left out)."""
        found: list[os.DirEntry] = []
        with contextlib.suppress(OSError):
            for sub in os.scandir(self.directory):
                if sub.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        found.extend(
                            e
                            for e in os.scandir(sub.path)
                            if e.name.endswith(SUFFIX)
                            and not e.name.startswith(".tmp-")
                            and e.is_file(follow_symlinks=False)
                        )
        return found

    def prune(self) -> None:
        """Delete least recently used files until at most ``max_bytes`` are stored."""
        with self._lock:
            sized = []
            for entry in self.entries():
                with contextlib.suppress(OSError):
                    found = entry.stat(follow_symlinks=False)
                    sized.append((found.st_mtime, found.st_size, entry.path))
            total = sum(size for _, size, _ in sized)
            for _, size, path in sorted(sized):
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(path)
                total -= size
            self._scanned, self._saved_since = total, 0


def store_key(*parts: str) -> str:
    """The key of a compiled grammar: a SHA-256 of what determines it."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()
