"""What became of a request: its output judged with ``jsonschema``, a refusal's first words,
and the counts over many requests (finished, parsed, valid).

Pure (no vLLM). ``check_output`` is the tests' judge of an output (``tests/output_checks.py``),
shared with the soak.
"""

from __future__ import annotations

import collections
from typing import Any

from tests.output_checks import VALIDATOR, check_output, format_checks

__all__ = ["VALIDATOR", "check_output", "first_words", "format_checks", "outcome_summary"]


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
