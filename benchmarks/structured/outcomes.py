"""What became of a request: its output judged with ``jsonschema``, a refusal's first words,
and the counts over many requests (finished, parsed, valid).

Pure (no vLLM); ``check_output`` is also what ``benchmarks/soak.py`` judges outputs with.
"""

from __future__ import annotations

import collections
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


def first_words(message: str, count: int = 8) -> str:
    """The first words of a refusal, after ``constrained: invalid option 'FIELD': ``."""
    prefix = "constrained: invalid option '"
    if message.startswith(prefix) and "': " in message:
        message = message.split("': ", 1)[1]
    return " ".join(message.split()[:count])


def outcome_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over per-request records with ``finish_reason`` and ``status``."""
    n = len(records)
    stop = [r for r in records if r["finish_reason"] == "stop"]
    valid = [r for r in stop if r["status"] == "valid"]
    parsed = [r for r in stop if r["status"] in ("valid", "invalid", "validator_error")]
    return {
        "requests": n,
        "finished_stop": len(stop),
        "finished_stop_share": len(stop) / n if n else None,
        "parsed_among_finished": len(parsed),
        "valid_among_finished": len(valid),
        "valid_among_finished_share": len(valid) / len(stop) if stop else None,
        "valid_all_share": len(valid) / n if n else None,
        "finish_reasons": dict(collections.Counter(r["finish_reason"] for r in records)),
        "statuses": dict(collections.Counter(r["status"] for r in records)),
    }
