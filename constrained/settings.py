"""Every environment switch of the package, read once, at first use.

Set them in the environment of the process that runs vLLM's engine (the server's, or the
script that builds ``LLM``); engine workers inherit it (on several nodes under Ray, set
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=CONSTRAINED_``: docs/scaling.md). ``settings()``
reads them the first time it is called and keeps the answer; ``reset()`` forgets it (tests
that change a switch). ``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=1`` is set by our launcher
(``python -m constrained serve``, unless ``--no-constrained-routing``): ``response_format``,
``structured_outputs`` and tool calls then reach our processors (``openai_routing``).

| variable | default | what it sets |
|---|---|---|
| ``CONSTRAINED_COMPILE_TIMEOUT_S`` | 10 | longest a constraint may take to compile at admission |
| ``CONSTRAINED_MAX_SCHEMA_BYTES`` | 4 MiB | largest ``json_schema`` accepted |
| ``CONSTRAINED_MAX_REGEX_SIZE`` | 20000 | largest unrolled ``regex`` / schema ``pattern`` |
| ``CONSTRAINED_ALLOWED_EXTRA_ARGS`` | (none) | keys of other plugins close to ours (``*``: any) |
| ``CONSTRAINED_UNKNOWN_EXTRA_ARGS`` | ``auto`` | keys nobody reads: by the engine, pass, refuse |
| ``CONSTRAINED_ENTRY_POINTS`` | 1 | 0: the installed (entry-point) processors stay inert |
| ``CONSTRAINED_STATS_PATH`` | (off) | file the engine rewrites with our state (one per worker) |
| ``CONSTRAINED_STATS_INTERVAL_S`` | 1.0 | at most one state snapshot per this many seconds |
| ``CONSTRAINED_CACHE`` | ``$XDG_CACHE_HOME/constrained`` | ``tiny-model`` builds (``~/.cache``) |
| ``CONSTRAINED_GRAMMAR_STORE`` | ``<cache>/grammars`` | compiled grammars (0700; ``off``) |
| ``CONSTRAINED_GRAMMAR_STORE_MB`` | 1024 | most the compiled-grammar store keeps on disk |
| ``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS`` | 0 (launcher: 1) | ``response_format``, tools to us |
| ``CONSTRAINED_TOOL_CALL_PARSER`` | (launcher: its ``--tool-call-parser``) | whose calls we write |
| ``CONSTRAINED_TRUNCATION_KERNELS`` | auto | truncation, XTC, n-gram kernels: 1 on, 0 off |
| ``CONSTRAINED_DRY_KERNEL`` | 1 | DRY's Triton kernels under Model Runner V2; 0: torch ops |
| ``CONSTRAINED_HOST_KERNELS`` | 1 | 0: no C kernels compiled for CPU paths (torch / NumPy) |
| ``CONSTRAINED_HOST_THREADS`` | 0 | most threads a host kernel uses; 0: torch's OpenMP team |
| ``CONSTRAINED_HELPER_CPUS`` | ``auto`` | our helper threads' CPUs (``off``; ``1,3``) |
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    compile_timeout_s: float = 10.0
    max_schema_bytes: int = 4 * 1024 * 1024
    max_regex_size: int = 20_000
    # None: any key allowed ("*"); else the keys meant for other plugins.
    allowed_extra_args: frozenset[str] | None = frozenset()
    stats_path: str | None = None
    stats_interval_s: float = 1.0
    cache_dir: Path = Path.home() / ".cache" / "constrained"
    # None: no compiled-grammar store (each process compiles for itself). Private: created
    # 0700, refused when others can write to it (grammars/store.py).
    grammar_store: Path | None = Path.home() / ".cache" / "constrained" / "grammars"
    grammar_store_mb: int = 1024
    route_structured_outputs: bool = False
    # extra_args keys that are not ours, vLLM's, nor allowed: "auto" refuses them where every
    # logits processor the engine builds is one whose keys we know (nobody would read
    # them), and passes them where another one is built; "pass" / "refuse": always.
    unknown_extra_args: str = "auto"
    # False: the processors vLLM loads from our entry points stay inert (opt-out).
    entry_points: bool = True
    # The server's vLLM tool parser: which call styles it reads back as we write them.
    tool_call_parser: str | None = None
    # The samplers' Triton kernels (processors/truncation_kernels.py, ngram_kernel.py). None
    # (auto): wherever Triton compiles (V2, V1 on CUDA; XTC's and no-repeat-ngram's: V2 only),
    # not under Triton's CPU interpreter, where typical-p's histogram passes take about a
    # second per 151,936-wide row; True / False force (processors/runners.triton_kernels_on).
    truncation_kernels: bool | None = None
    # DRY's Triton kernels under Model Runner V2 (processors/dry_kernel.py: two launches a
    # step, cheap under the interpreter too: nothing vocabulary-sized); False: the torch ops
    # of dry_math (~200 launches a step). V1 always runs dry_math.
    dry_kernel: bool = True
    # C kernels compiled at first use for host hot paths (processors/host_kernels.py; typical-p
    # under V1 on CPU); False: their torch / NumPy paths.
    host_kernels: bool = True
    # At most this many threads share a batch's rows in a host kernel (typical-p's search
    # under V1 on CPU); 0: the process's OpenMP team (torch's threads, bound by vLLM).
    host_threads: int = 0
    # Where our helper threads (the mask fill, compiles, the tokenizer's tables) run
    # (helper_cpus.py): "auto", in a CPU worker vLLM bound automatically, the CPUs of its
    # NUMA nodes that the binding left out; "off", where they were started; or these CPU ids.
    helper_cpus: str | frozenset[int] = "auto"


def _number(name: str, cast: type, default: float | int) -> float | int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {cast.__name__}") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def _from_environment() -> Settings:
    defaults = Settings()
    keys = frozenset(
        k.strip() for k in os.environ.get("CONSTRAINED_ALLOWED_EXTRA_ARGS", "").split(",")
    ) - {""}
    cache_dir = Path(os.environ.get("CONSTRAINED_CACHE") or user_cache_dir() / "constrained")
    return Settings(
        compile_timeout_s=_number(
            "CONSTRAINED_COMPILE_TIMEOUT_S", float, defaults.compile_timeout_s
        ),
        max_schema_bytes=_number("CONSTRAINED_MAX_SCHEMA_BYTES", int, defaults.max_schema_bytes),
        max_regex_size=_number("CONSTRAINED_MAX_REGEX_SIZE", int, defaults.max_regex_size),
        allowed_extra_args=None if "*" in keys else keys,
        stats_path=os.environ.get("CONSTRAINED_STATS_PATH") or None,
        stats_interval_s=_number("CONSTRAINED_STATS_INTERVAL_S", float, defaults.stats_interval_s),
        cache_dir=cache_dir,
        grammar_store=_store_dir(cache_dir),
        grammar_store_mb=_number("CONSTRAINED_GRAMMAR_STORE_MB", int, defaults.grammar_store_mb),
        route_structured_outputs=_switch(
            "CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS", defaults.route_structured_outputs
        ),
        tool_call_parser=os.environ.get("CONSTRAINED_TOOL_CALL_PARSER") or None,
        unknown_extra_args=_choice("CONSTRAINED_UNKNOWN_EXTRA_ARGS", ("auto", "pass", "refuse")),
        entry_points=_switch("CONSTRAINED_ENTRY_POINTS", defaults.entry_points),
        truncation_kernels=_switch("CONSTRAINED_TRUNCATION_KERNELS", None),
        dry_kernel=_switch("CONSTRAINED_DRY_KERNEL", defaults.dry_kernel),
        host_kernels=_switch("CONSTRAINED_HOST_KERNELS", defaults.host_kernels),
        host_threads=_number("CONSTRAINED_HOST_THREADS", int, defaults.host_threads),
        helper_cpus=_cpus("CONSTRAINED_HELPER_CPUS"),
    )


def _choice(name: str, values: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().lower() or values[0]
    if raw not in values:
        raise ValueError(f"{name}={raw!r} must be one of {', '.join(values)}")
    return raw


MAX_CPU_ID = 1 << 16  # (Linux's own limit is 8,192 CPUs)


def cpu_list(text: str) -> frozenset[int]:
    """CPU ids written as Linux writes them (``0-3,7``); ``ValueError`` when malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first or last >= MAX_CPU_ID:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _cpus(name: str) -> str | frozenset[int]:
    raw = os.environ.get(name, "").strip().lower() or "auto"
    if raw in ("auto", "off"):
        return raw
    try:
        return cpu_list(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be auto, off or CPU ids (1,3 or 2-5)") from None


def user_cache_dir() -> Path:
    """The user's cache directory: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    raw = os.environ.get("XDG_CACHE_HOME", "").strip()
    return Path(raw) if raw and os.path.isabs(raw) else Path.home() / ".cache"


def _switch(name: str, default: bool | None) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in ("0", "1", "true", "false"):
        raise ValueError(f"{name}={raw!r} must be 0 or 1")
    return raw in ("1", "true")


def _store_dir(cache_dir: Path) -> Path | None:
    raw = os.environ.get("CONSTRAINED_GRAMMAR_STORE", "").strip()
    if raw.lower() == "off":
        return None
    return Path(raw) if raw else cache_dir / "grammars"


@functools.cache
def settings() -> Settings:
    """The package's settings, read from the environment on the first call."""
    return _from_environment()


def reset() -> None:
    """Forget the settings read so far; the next ``settings()`` reads the environment again."""
    settings.cache_clear()
