"""Refusing, for every backend, a constraint whose regexes are too big to unroll.

A ``regex`` constraint, or a JSON schema's ``pattern`` / ``patternProperties`` name, whose
``regex_size`` is over ``settings().max_regex_size`` (``CONSTRAINED_MAX_REGEX_SIZE``) is
refused before any backend sees it: such regexes fail mid-generation or slow every decoding
step of the batch (see ``regex_size``).
"""

from __future__ import annotations

import json

from constrained.grammars.errors import GrammarError
from constrained.grammars.regex_size import regex_size_problem
from constrained.grammars.schema_walk import iter_subschemas
from constrained.grammars.spec import GrammarSpec


def refuse_huge_regexes(spec: GrammarSpec) -> None:
    """Raise ``GrammarError`` when a regex of ``spec`` is too big to unroll."""
    if spec.kind == "regex":
        problem = regex_size_problem(spec.source)
        if problem:
            raise GrammarError("", problem)
    elif spec.kind == "json_schema":
        for path, sub in iter_subschemas(json.loads(spec.source)):
            patterns = [sub.get("pattern"), *(sub.get("patternProperties") or {})]
            for pattern in patterns:
                problem = isinstance(pattern, str) and regex_size_problem(pattern)
                if problem:
                    raise GrammarError("", f"'pattern' at {path} {problem}", keyword="pattern")
