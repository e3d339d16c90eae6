"""Refusing, for every backend, a constraint whose regexes are too big to unroll.

A ``regex`` constraint, or a JSON schema's ``pattern`` / ``patternProperties`` name (in a
structural tag too, with its regex parts), whose
``regex_size`` is over ``settings().max_regex_size`` (``CONSTRAINED_MAX_REGEX_SIZE``) is
refused before any backend sees it: such regexes fail mid-generation or slow every decoding
step of the batch (see ``regex_size``).
"""

from __future__ import annotations

import json

from constrained.errors import GrammarError
from constrained.grammars.regex_size import regex_size_problem
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.structural_tag import SCHEMA_FORMATS, parts
from constrained.schema.walk import iter_subschemas


def refuse_huge_regexes(spec: GrammarSpec) -> None:
    """Raise ``GrammarError`` when a regex of ``spec`` is too big to unroll."""
    if spec.kind == "regex":
        problem = regex_size_problem(spec.source)
        if problem:
            raise GrammarError("", problem)
    elif spec.kind == "json_schema":
        _refuse_huge_patterns(json.loads(spec.source))
    elif spec.kind == "structural_tag":
        tag = json.loads(spec.source)
        for where, part in parts(tag["format"]):
            if part["type"] == "regex":
                problem = regex_size_problem(part["pattern"])
                if problem:
                    raise GrammarError("", f"regex at {where} {problem}")
            elif part["type"] in SCHEMA_FORMATS:
                _refuse_huge_patterns(part["json_schema"], f"{where}/json_schema ")


def _refuse_huge_patterns(schema: object, where: str = "") -> None:
    for path, sub in iter_subschemas(schema):
        patterns = [sub.get("pattern"), *(sub.get("patternProperties") or {})]
        for pattern in patterns:
            problem = isinstance(pattern, str) and regex_size_problem(pattern)
            if problem:
                raise GrammarError("", f"'pattern' at {where}{path} {problem}", keyword="pattern")
