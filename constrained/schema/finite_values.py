"""Finite sets of JSON values judged exactly: the values an ``enum`` / ``const`` allows,
kept or dropped by ``jsonschema`` only where it judges them as the backends would.

Shared by ``rewrite`` (a finite node written as the values it accepts) and ``satisfiable``
(a finite node with no value left has no instance).

Example::

    >>> schema = {"enum": [1, 7], "maximum": 5}
    >>> valid_values(schema, schema, finite_candidates(schema, schema))
    [1]
"""

from __future__ import annotations

import decimal
import re
from typing import Any

from jsonschema import validators

from constrained.schema.negation import conjuncts, values_of
from constrained.schema.walk import is_int, is_number, is_unknown_format, reachable_subschemas

MAX_FINITE_VALUES = 1000  # values of an enum judged one by one


# Without a ``$schema``, every keyword is enforced whichever draft defined it (``const``,
# ``if``... as the rewrite rules do): values are kept where these drafts agree.
DRAFTS = (
    validators.Draft7Validator,
    validators.Draft201909Validator,
    validators.Draft202012Validator,
)


# Keywords whose verdict ``jsonschema`` may give differently from the backends (regex
# dialects, format checkers, floating-point ``multipleOf``) or not at all (remote references,
# dynamic scopes): a finite node using them is left to the other rules.
_NOT_JUDGED = frozenset(
    {"format", "$dynamicRef", "$recursiveRef", "unevaluatedProperties", "unevaluatedItems"}
)


def finite_candidates(schema: Any, root: Any) -> list[Any] | None:
    """The fewest values an ``enum`` / ``const`` among ``schema``'s conjuncts allows (every
    instance is one of them), at most ``MAX_FINITE_VALUES``; ``None`` if none bounds them."""
    found = None
    for conjunct in conjuncts(schema, root):
        values = values_of(conjunct) if isinstance(conjunct, dict) else None
        if values is not None and (found is None or len(values) < len(found)):
            found = values
    return found if found is not None and len(found) <= MAX_FINITE_VALUES else None


def judged_exactly(node: dict, root: Any, candidates: list[Any]) -> bool:
    """``jsonschema`` judges ``candidates`` against ``node`` as the backends would: no
    keyword of ``_NOT_JUDGED`` (an unknown ``format`` asserts nothing), local ``$ref``s only,
    integral ``multipleOf`` over integers only, and patterns only where ECMA-262 and Python
    agree (``same_regex``) on strings without line breaks."""
    strings = [text for value in candidates for text in _strings_in(value)]
    for _, sub in reachable_subschemas(node, root):
        for keyword, value in sub.items():
            if keyword in _NOT_JUDGED and not (keyword == "format" and is_unknown_format(value)):
                return False
            if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
                return False
            if keyword in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
                return False  # draft 4's meaning, which later drafts would misread
            if keyword == "multipleOf" and not _exact_multiples(value, candidates):
                return False
            patterns = [value] if keyword == "pattern" else []
            if keyword in ("patternProperties",) and isinstance(value, dict):
                patterns = list(value)
            if patterns and not all(same_regex(p, strings) for p in patterns):
                return False
    return True


def _exact_multiples(divisor: Any, candidates: list[Any]) -> bool:
    """``jsonschema`` (floating point) tells, for every number in ``candidates``, whether it
    is a multiple of ``divisor`` as the decimal numbers written are."""
    if not is_number(divisor) or divisor <= 0:
        return False
    numbers = [v for v in _leaves(candidates) if is_number(v)]
    if is_int(divisor) and all(is_int(v) for v in numbers):
        return True  # integer remainders: exact
    check = validators.Draft202012Validator({"multipleOf": divisor})
    try:
        with decimal.localcontext() as exact:
            exact.prec = 1000
            step = decimal.Decimal(repr(divisor))
            return all(check.is_valid(v) == (decimal.Decimal(repr(v)) % step == 0) for v in numbers)
    except (ArithmeticError, ValueError):
        return False


# Read differently by Python's ``re``: its extensions (``(?``, possessive quantifiers), ``{,n}``
# (a quantifier in Python only), nested sets, and ``[]`` / ``[^]`` (an empty class and any
# character in ECMA-262, the start of a class holding ``]`` in Python).
_PYTHON_ONLY = ("(?", "*+", "++", "?+", "}+", "{,", "[[", "[]", "[^]")


def same_regex(pattern: Any, strings: list[str]) -> bool:
    """Python's ``re.search`` and ECMA-262 agree on ``pattern`` over ``strings``: printable
    strings of the Basic Multilingual Plane (no line break: ``.`` and ``$`` differ there;
    one UTF-16 unit per character), and a pattern of such literals, ``.``, classes, groups,
    alternation, quantifiers and anchors only: no escape of a letter or digit (``\\d``,
    ``\\s``, ``\\b``... differ), none of ``_PYTHON_ONLY``."""
    if not isinstance(pattern, str) or not _bmp_printable(pattern):
        return False
    if any(text in pattern for text in _PYTHON_ONLY):
        return False
    if re.search(r"\\[A-Za-z0-9]", pattern):
        return False
    return all(_bmp_printable(text) for text in strings)


def _bmp_printable(text: str) -> bool:
    return text.isprintable() and all(ord(ch) <= 0xFFFF for ch in text)


def valid_values(node: dict, root: Any, candidates: list[Any]) -> list[Any] | None:
    """The candidates ``node`` accepts, judged with the root's draft, or the drafts of
    ``DRAFTS`` in agreement; ``None`` when they disagree or ``jsonschema`` cannot judge."""
    known = (
        validators.validator_for(root, default=None)
        if isinstance(root, dict) and isinstance(root.get("$schema"), str)
        else None
    )
    drafts = [known] if known is not None else list(DRAFTS)
    kept = []
    try:
        checks = [cls(root).evolve(schema=node) for cls in drafts]
        for value in candidates:
            verdicts = {check.is_valid(value) for check in checks}
            if len(verdicts) > 1:
                return None
            if verdicts.pop():
                kept.append(value)
    except Exception:  # a schema one draft cannot read (booleans in draft 4...)
        return None
    return kept


def _leaves(values: list[Any]) -> list[Any]:
    """Every scalar inside ``values``."""
    found: list[Any] = []
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        else:
            found.append(value)
    return found


def _strings_in(value: Any) -> list[str]:
    """Every string inside a JSON value, object keys included."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found
