"""C kernels for host (CPU) hot paths, compiled at first use with the machine's C compiler.

A pass over a [rows, 151,936] block costs about as much as its arithmetic on CPU, and eager
torch / NumPy ops make one pass each; a few small C functions fuse them where that decides a
target (typical-p's search, the truncation samplers' mask: ``truncation_host.c``). vLLM's CPU
build compiles its model with a C++
compiler already (the inductor), so a CPU deployment has one. Each source ships in this
package and is compiled once per machine into ``<cache>/host-kernels`` (``settings.cache_dir``),
named by a hash of the source, the flags and the CPU's feature flags (a shared home on other
hardware builds its own), written atomically (processes starting together each build and
one rename wins), and loaded with ``ctypes``.

Where no compiler works, or ``CONSTRAINED_HOST_KERNELS=0``, ``load`` returns ``None`` once
(logged) and callers keep their torch / NumPy path, which computes the same thing.

A kernel may share a batch's rows among the process's OpenMP threads (``threads``; each row's
result is the same whichever thread runs it): vLLM's CPU worker runs the model on them, bound
to its cores, and they idle (spinning) while the logits processors run.

Example::

    lib = load("truncation_host")        # a ctypes.CDLL, or None
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from constrained.settings import settings

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent
# -ffp-contract=off: no product fused into an FMA, so every machine rounds alike (the
# sources sum in fixed lanes for the same reason); -march=native: the vector width there.
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-funroll-loops",
         "-fPIC", "-shared")  # fmt: skip
NATIVE = ("-march=native",)
# OpenMP: the library then shares rows among the threads of the OpenMP runtime torch loaded
# (the same soname, so the loader reuses torch's copy); tried first, left out where the
# compiler has none.
OPENMP = ("-fopenmp",)
COMPILE_TIMEOUT_S = 120


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` / ``gcc`` / ``clang`` on the path."""
    named = os.environ.get("CC", "").strip()
    candidates = [named] if named else ["cc", "gcc", "clang"]
    return next((found for c in candidates if (found := shutil.which(c))), None)


def threads(lib: ctypes.CDLL | None) -> int:
    """How many threads ``lib``'s row-parallel kernels share a batch's rows among: the
    process's OpenMP team (torch's threads, which vLLM's CPU worker binds to its cores), at
    most ``CONSTRAINED_HOST_THREADS`` where set; 1 without OpenMP, or where loading ``lib``
    brought an OpenMP runtime torch does not use (its threads would contend with torch's)."""
    if lib is None or getattr(lib, "own_openmp", False):
        return 1
    try:
        team = max(1, int(lib.parallel_threads()))  # its signature: the math module's loader
    except AttributeError:  # a library with no row-parallel kernels
        return 1
    named = settings().host_threads
    return min(team, named) if named else team


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtimes mapped into this process (libgomp, libiomp5, libomp), by path;
    empty where ``/proc`` cannot say."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {
        line.split()[-1]
        for line in maps.splitlines()
        if "omp" in line.rsplit("/", 1)[-1] and line.split()[-1].startswith("/")
    }


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """``<name>.c`` of this folder, compiled (once per machine) and loaded; ``None`` when
    host kernels are off or no compiler builds it (logged once)."""
    if not settings().host_kernels:
        return None
    source = SOURCES / f"{name}.c"
    cc = compiler()
    if cc is None:
        logger.warning("constrained: no C compiler found: %s runs in torch / NumPy", name)
        return None
    text = source.read_bytes()
    # a compiler without OpenMP, or without -march=native: plainer builds
    for flags in ((*FLAGS, *OPENMP, *NATIVE), (*FLAGS, *NATIVE), FLAGS):
        key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), _cpu_flags().encode(),
                                         cc.encode()])).hexdigest()[:16]  # fmt: skip
        target = settings().cache_dir / "host-kernels" / f"{name}-{key}.so"
        if not target.is_file() and not _build(cc, source, flags, target):
            continue
        try:
            before = _openmp_runtimes()
            lib = ctypes.CDLL(str(target))
            lib.own_openmp = bool(_openmp_runtimes() - before)
            if lib.own_openmp:
                logger.warning("constrained: %s loaded an OpenMP runtime of its own: one "
                               "thread", name)  # fmt: skip
            return lib
        except OSError as exc:
            logger.warning("constrained: %s did not load (%s)", target, exc)
    logger.warning("constrained: %s did not compile: it runs in torch / NumPy", name)
    return None


def _build(cc: str, source: Path, flags: tuple[str, ...], target: Path) -> bool:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *flags, str(source), "-o", temporary, "-lm"],
            capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            logger.info("constrained: %s %s failed: %s", cc, source.name, done.stderr[-500:])
            return False
        os.replace(temporary, target)  # atomic: a process starting beside us sees all or none
        return True
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("constrained: %s %s failed: %s", cc, source.name, exc)
        return False
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
