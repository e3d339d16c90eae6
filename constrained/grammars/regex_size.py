"""How big a regex is once its counted repetitions are unrolled, so huge ones are refused early.

Every backend builds automaton states per unrolled position: ``x{1000000}`` or
``(a|aa){1000}{1000}`` compile lazily in llguidance, then fail mid-generation ("too many
expressions constructed"), and ``x{100000}`` costs 0.12 s per decoding step, stalling the
whole batch. The size is the number of atoms after unrolling: ``x{n}`` is ``n``, nesting
multiplies, alternatives and sequences add, ``*`` / ``+`` count their body once.

Example::

    >>> regex_size("[a-z]{2,8}-\\d{4}")
    13
    >>> regex_size("(a|aa){1000}{1000}")
    1000000
"""

from __future__ import annotations

import re
from typing import Any

from constrained.settings import settings

try:  # Python 3.11+: the parser behind ``re``
    import re._constants as _sre
    import re._parser as _parser
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _parser  # type: ignore[no-redef]

MAX_REGEX_SIZE_ENV = "CONSTRAINED_MAX_REGEX_SIZE"

_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None))


_COUNT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def regex_size(pattern: str) -> int:
    """Atoms in ``pattern`` with counted repetitions unrolled.

    Syntax Python's ``re`` cannot parse (``\\p{L}``, or the stacked ``a{2}{3}`` Rust's regex
    takes) is bounded instead by the product of every count in it, as if all were nested.
    """
    try:
        return _size(_parser.parse(pattern))
    except (re.error, RecursionError, OverflowError):
        product = 1
        for low, high in _COUNT.findall(pattern):
            product *= max(int(high) if high else int(low), 1)
        return max(product, len(pattern))


def _size(items: Any) -> int:
    total = 0
    for op, arg in items:
        if op in _REPEATS:
            low, high, body = arg
            count = high if high != _sre.MAXREPEAT else max(low, 1)
            total += max(count, 1) * _size(body)
        elif op == _sre.SUBPATTERN:
            total += _size(arg[-1])
        elif op == _sre.BRANCH:
            total += sum(_size(branch) for branch in arg[1])
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            total += _size(arg[1])
        elif op == getattr(_sre, "ATOMIC_GROUP", None):
            total += _size(arg)
        elif op == _sre.GROUPREF_EXISTS:
            total += sum(_size(part) for part in arg[1:] if part is not None)
        else:
            total += 1
    return total


def regex_size_problem(pattern: str, limit: int | None = None) -> str | None:
    """Why ``pattern`` is too big to compile, or ``None``; ``limit`` defaults to
    ``settings().max_regex_size``."""
    if limit is None:
        limit = settings().max_regex_size
    size = regex_size(pattern)
    if size > limit:
        return (
            f"unrolls to {size:,} positions (counted repetitions multiplied out), more than "
            f"{limit:,} ({MAX_REGEX_SIZE_ENV})"
        )
    return None
