"""Judging a constrained output: does it parse, and does it validate against its schema?

Used by the soak (``tests/soak.py``) and the structured-output benchmarks
(``benchmarks/structured/``).
"""

from __future__ import annotations

import json
from typing import Any

# How check_output builds its validator, as the validity report records it.
VALIDATOR = (
    "jsonschema validator_for(schema, default=Draft202012Validator), "
    "format_checker=cls.FORMAT_CHECKER"
)


def check_output(text: str, schema: Any) -> tuple[str, str | None]:
    """``(status, detail)``: status is ``valid``, ``not_json``, ``invalid`` or ``validator_error``.

    The validator is the schema's own draft (``$schema``; 2020-12 when absent) with that
    draft's format checker (formats whose checker needs a package that is not installed pass).
    """
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import best_match

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return "not_json", f"{exc.msg} at char {exc.pos}"
    try:
        cls = validators.validator_for(schema, default=Draft202012Validator)
        error = best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception as exc:  # unresolvable $ref, unknown draft, ...
        return "validator_error", f"{type(exc).__name__}: {exc}"[:500]
    if error is None:
        return "valid", None
    path = "/".join(str(p) for p in error.absolute_path)
    return "invalid", f"{error.message[:400]} (at /{path}; keyword {error.validator})"


def format_checks() -> list[str]:
    """The formats the 2020-12 format checker checks here (depends on installed packages)."""
    from jsonschema import Draft202012Validator

    return sorted(Draft202012Validator.FORMAT_CHECKER.checkers)
