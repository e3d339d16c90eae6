"""The grammar backends, in the order ``auto`` tries them; every list of backends derives here.

Adding a backend: a module that defines ``BACKEND = Backend(...)`` (see ``backend.py``) and
one line in ``BACKENDS`` below, at the place ``auto`` should try it.

Example::

    >>> BACKEND_NAMES
    ('auto', 'llguidance', 'xgrammar', 'outlines')
    >>> get_backend("xgrammar").name
    'xgrammar'
"""

from __future__ import annotations

from constrained.grammars import llguidance_backend, outlines_backend, xgrammar_backend
from constrained.grammars.backend import Backend

AUTO = "auto"

# ``auto`` tries them in this order: llguidance first (it refuses what it cannot enforce),
# then the others where they enforce every keyword the schema uses.
BACKENDS: tuple[Backend, ...] = (
    llguidance_backend.BACKEND,
    xgrammar_backend.BACKEND,
    outlines_backend.BACKEND,
)

#: What ``grammar_backend`` accepts: ``auto`` first, then each backend in ``auto`` order.
BACKEND_NAMES: tuple[str, ...] = (AUTO, *(b.name for b in BACKENDS))

_BY_NAME: dict[str, Backend] = {b.name: b for b in BACKENDS}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (not ``auto``).

    Raises:
        KeyError: no backend has that name.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no grammar backend {name!r}; one of {', '.join(_BY_NAME)}") from None
