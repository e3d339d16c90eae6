"""Schemas with no valid instance, found and named by the keywords that contradict.

``no_instance(schema)`` returns a ``Contradiction`` (the keywords, where, and why) when it can
prove that no JSON value satisfies ``schema``, else ``None``. It never calls a satisfiable
schema unsatisfiable: every rule below over-approximates the set of instances (a keyword it
does not read only makes that set larger), so "empty" is a proof; "not empty" may be a miss.

The method, per subschema: its conjuncts (``allOf`` branches and ``$ref`` targets, taken
together) are judged kind by kind (JSON's types, numbers split into integers and fractions):

- ``type``, ``enum`` / ``const`` and ``not`` of a schema that accepts a whole kind leave
  some kinds;
- a finite ``enum`` / ``const`` is judged value by value with ``jsonschema``, where it judges
  as the backends do (``finite_values``): exact;
- numbers: ``minimum`` / ``maximum`` (exclusive or not, draft 4's booleans too) and integral
  ``multipleOf``; strings: ``minLength`` / ``maxLength``;
- arrays: ``minItems`` / ``maxItems`` against item positions that accept nothing,
  ``contains`` (with ``minContains`` / ``maxContains``) against what ``items`` /
  ``prefixItems`` allow, ``uniqueItems`` against the number of distinct values items can take;
- objects: each ``required`` property against ``properties``, ``patternProperties``,
  ``additionalProperties`` and ``propertyNames``, and their count against ``maxProperties``;
- ``anyOf`` / ``oneOf``: empty when every branch is (with the rest of the node).

A subschema is empty when every kind is. Nested subschemas are judged where the instance must
have them (a required property, the items ``minItems`` asks for, the item ``contains``
asks for), up to ``MAX_DEPTH`` levels and ``MAX_STEPS`` judgements a schema.

Example::

    >>> no_instance({"type": "array", "maxItems": 1, "items": {"type": "integer",
    ...              "maximum": 5}, "contains": {"const": 7}}).keywords
    ('contains', 'items', 'const', 'maximum', 'type')
    >>> no_instance({"type": "integer", "minimum": 1}) is None
    True
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

from constrained.schema.finite_values import (
    finite_candidates,
    judged_exactly,
    same_regex,
    valid_values,
)
from constrained.schema.negation import KINDS, kinds_of
from constrained.schema.rewrite import in_its_draft
from constrained.schema.walk import (
    ANNOTATIONS,
    escape_pointer,
    is_int,
    is_number,
    is_unknown_format,
    resolve_pointer,
)

MAX_DEPTH = 12  # nested subschemas followed (recursive schemas stop here: "not empty")
MAX_STEPS = 2000  # subschema judgements a schema may take (then: "not empty")
MAX_BRANCH_SETS = 64  # anyOf / oneOf branch combinations tried in one subschema
MAX_DISTINCT = 256  # values counted for uniqueItems

_NUMBERS = frozenset({"integer", "fraction"})
# The keywords that assert something of one kind of instance only.
_KIND_KEYWORDS = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset(
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    ),
    "array": frozenset(
        {
            "items",
            "prefixItems",
            "additionalItems",
            "contains",
            "minContains",
            "maxContains",
            "minItems",
            "maxItems",
            "uniqueItems",
            "unevaluatedItems",
        }
    ),
    "object": frozenset(
        {
            "properties",
            "patternProperties",
            "additionalProperties",
            "required",
            "minProperties",
            "maxProperties",
            "propertyNames",
            "dependentRequired",
            "dependentSchemas",
            "dependencies",
            "unevaluatedProperties",
        }
    ),
}


@dataclasses.dataclass(frozen=True)
class Contradiction:
    """Why a schema has no valid instance: the keywords that contradict, where, and how."""

    keywords: tuple[str, ...]
    why: str

    def message(self) -> str:
        named = ", ".join(f"'{k}'" for k in self.keywords)
        return f"has no valid instance: {self.why} (contradicting keywords: {named})"


def no_instance(schema: Any) -> Contradiction | None:
    """Why no JSON value satisfies ``schema``, or ``None`` when that is not proven."""
    # Keywords its declared draft does not define say nothing there.
    schema = in_its_draft(copy.deepcopy(schema))
    if schema is None:  # draft 3: other meanings
        return None
    judge = _Judge(schema, _siblings_of_ref_count(schema))
    try:
        return judge.empty([("#", schema)], 0)
    except _OutOfSteps:
        return None


class _OutOfSteps(Exception):
    pass


class _Judge:
    def __init__(self, root: Any, ref_siblings: bool) -> None:
        self.root = root
        self.ref_siblings = ref_siblings
        self.steps = 0

    def conjuncts(self, schema: Any, path: str) -> list[tuple[str, Any]]:
        return _conjuncts(schema, path, self.root, self.ref_siblings)

    # ---- a subschema: its conjuncts ----------------------------------------------------

    def empty(self, parts: list[tuple[str, Any]], depth: int) -> Contradiction | None:
        """Why the conjunction of ``parts`` ((path, subschema) pairs) has no instance."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _OutOfSteps
        if depth > MAX_DEPTH:
            return None
        flat: list[tuple[str, dict]] = []
        for path, part in parts:
            for at, node in self.conjuncts(part, path):
                if node is False:
                    return _false_at(at)
                flat.append((at, node))
        if not flat:
            return None  # nothing asked: any value
        return self._empty_with_branches(flat, depth, 0)

    def _empty_with_branches(
        self, flat: list[tuple[str, dict]], depth: int, tried: int
    ) -> Contradiction | None:
        """``anyOf`` / ``oneOf`` of one conjunct opened, branch by branch (each judged with
        the other conjuncts); empty when every branch is."""
        for i, (path, node) in enumerate(flat):
            for keyword in ("anyOf", "oneOf"):
                branches = node.get(keyword)
                if not isinstance(branches, list) or not branches:
                    continue
                if tried + len(branches) > MAX_BRANCH_SETS:
                    return None
                if keyword == "oneOf" and sum(_accepts_all(b) for b in branches) > 1:
                    return Contradiction(
                        ("oneOf",),
                        f"two branches of 'oneOf' at {path} accept every value, so "
                        "every value matches more than one",
                    )
                rest = [*flat[:i], (path, _without(node, keyword)), *flat[i + 1 :]]
                found = []
                for j, branch in enumerate(branches):
                    at = f"{path}/{keyword}/{j}"
                    opened = [*rest, *self.conjuncts(branch, at)]
                    if any(n is False for _, n in opened):
                        found.append(_false_at(at))
                        continue
                    why = self._empty_with_branches(opened, depth, tried + len(branches))
                    if why is None:
                        return None
                    found.append(why)
                keywords = _merge((keyword,), *(c.keywords for c in found))
                reasons = "; ".join(f"branch {j}: {c.why}" for j, c in enumerate(found))
                return Contradiction(
                    keywords, f"no branch of '{keyword}' at {path} can hold ({reasons})"
                )
        return self._empty_node(flat, depth)

    def _empty_node(self, flat: list[tuple[str, dict]], depth: int) -> Contradiction | None:
        nodes = [node for _, node in flat]
        where = flat[0][0] if flat else "#"
        finite = self._finite(flat)
        if finite is not None:
            return finite or None
        kinds = set(KINDS)
        for _, node in flat:
            kinds &= kinds_of(node)
        if not kinds:
            used = _merge(*(tuple(k for k in ("type", "enum", "const") if k in n) for n in nodes))
            return Contradiction(
                used, f"its 'type' / 'enum' / 'const' at {where} allow no type of value in common"
            )
        for path, node in flat:
            negated = node.get("not")
            if "not" in node:
                accepted = {k for k in kinds if _accepts_kind(negated, k)}
                if accepted == kinds:
                    return Contradiction(
                        ("not",), f"'not' at {path} rejects every value the rest allows"
                    )
                kinds -= accepted
        reasons: list[Contradiction] = []
        for kind in sorted(kinds):
            why = self._kind_empty(kind, flat, depth)
            if why is None:
                return None
            reasons.append(why)
        keywords = _merge(*(r.keywords for r in reasons))
        if len(kinds) < len(KINDS) and any("type" in n for n in nodes):
            keywords = _merge(keywords, ("type",))
        return Contradiction(keywords, "; ".join(dict.fromkeys(r.why for r in reasons)))

    def _finite(self, flat: list[tuple[str, dict]]) -> Contradiction | bool | None:
        """Exactly, where the node is an ``enum`` / ``const`` ``jsonschema`` judges as the
        backends do: a ``Contradiction`` when no value is left, ``False`` when one is,
        ``None`` when the values are not judged here."""
        node = _all_of([n for _, n in flat])
        values = finite_candidates(node, self.root)
        if values is None or not judged_exactly(node, self.root, values):
            return None
        kept = valid_values(node, self.root, values)
        if kept is None:
            return None
        if kept:
            return False
        named, at = next(
            ((k, p) for p, n in flat for k in ("const", "enum") if _values_are(n, k, values)),
            ("enum", flat[0][0]),
        )
        failing = _failing_keywords(node, self.root, values)
        if not values:
            return Contradiction((named,), f"'{named}' at {at} lists no value")
        shown = ", ".join(_short(v) for v in values[:3]) + (", ..." if len(values) > 3 else "")
        return Contradiction(
            _merge((named,), failing),
            f"no value of '{named}' ({shown}) at {at} passes "
            + ", ".join(f"'{k}'" for k in failing),
        )

    # ---- one kind of value ---------------------------------------------------------------

    def _kind_empty(
        self, kind: str, flat: list[tuple[str, dict]], depth: int
    ) -> Contradiction | None:
        if kind in _NUMBERS:
            return _numbers_empty(kind, flat)
        if kind == "string":
            return _strings_empty(flat)
        if kind == "array":
            return _arrays_empty(self, flat, depth)
        if kind == "object":
            return _objects_empty(self, flat, depth)
        return None  # null, boolean: only type / enum / const / not restrict them

    def _distinct_values(self, parts: list[tuple[str, Any]]) -> list[Any] | None:
        """At least every value ``parts`` allow, when they are few; ``None`` otherwise."""
        flat = [(p, n) for path, part in parts for p, n in self.conjuncts(part, path)]
        if any(n is False for _, n in flat):
            return []
        if not flat:
            return None
        node = _all_of([n for _, n in flat])
        values = finite_candidates(node, self.root)
        if values is None:
            values = _small_domain(flat)
        if values is None:
            return None
        if judged_exactly(node, self.root, values):
            values = valid_values(node, self.root, values) or values
        return values


# ---- arrays and objects ----------------------------------------------------------------


def _arrays_empty(judge: _Judge, flat: list[tuple[str, dict]], depth: int) -> Contradiction | None:
    where = flat[0][0]
    crossed = _crossed(flat, "minItems", "maxItems")
    if crossed is not None:
        return crossed
    low, high = (
        _tightest(flat, "minItems", max, 0)[0],
        _tightest(flat, "maxItems", min, math.inf)[0],
    )
    items = _ItemPositions(flat)
    room, closed_by = high, None
    for index in range(items.prefix_length + 1):
        if index >= room:
            break
        why = judge.empty(items.at(index), depth + 1)
        if why is not None:
            room, closed_by = index, why
            break
    if low > room:
        words = _merge(("minItems", *items.keywords()), closed_by.keywords)
        return Contradiction(
            words,
            f"'minItems' {low} at {where} asks for item {room}, "
            f"which can have no value: {closed_by.why}",
        )
    unique = any(node.get("uniqueItems") is True for _, node in flat)
    for path, node in flat:
        if "contains" not in node:
            continue
        limit = ("maxItems",) if closed_by is None else closed_by.keywords
        why = _contains_empty(judge, path, node, items, room, limit, unique, depth)
        if why is not None:
            return why
    if unique:
        return _unique_empty(judge, flat, items, low, depth)
    return None


def _contains_empty(
    judge: _Judge,
    path: str,
    node: dict,
    items: _ItemPositions,
    room: float,
    limit: tuple[str, ...],
    unique: bool,
    depth: int,
) -> Contradiction | None:
    """``contains`` against the items there is room for (``limit``: what sets it)."""
    at_least = node.get("minContains", 1)
    at_most = node.get("maxContains", math.inf)
    if not is_int(at_least) or not is_number(at_most):
        return None
    # Without minContains, contains itself asks for one.
    least = "minContains" if "minContains" in node else "contains"
    if at_least > at_most:
        return Contradiction(
            (least, "maxContains"),
            f"'{least}' asks for {at_least} matching items, 'maxContains' allows {at_most} "
            f"at {path}",
        )
    if at_least == 0:
        return None
    wanted = (f"{path}/contains", node["contains"])
    able, missed = 0.0, None
    for index in range(min(items.prefix_length, room)):
        why = judge.empty([*items.at(index), wanted], depth + 1)
        able += why is None
        missed = missed or why
    if room > items.prefix_length:
        why = judge.empty([*items.at(items.prefix_length), wanted], depth + 1)
        if why is None:
            able += room - items.prefix_length
        missed = missed or why
    if unique and not items.prefix_length and able:
        distinct = judge._distinct_values([*items.at(0), wanted])
        able = able if distinct is None else min(able, len(distinct))
    if able >= at_least:
        return None
    if able == 0 and missed is None:  # no room for an item at all
        return Contradiction(
            ("contains", *limit), f"'contains' at {path} needs an item, and no item fits"
        )
    if able == 0:
        words = _merge(("contains", *items.keywords()), missed.keywords)
        what = "'items' cannot be" if items.keywords() else "nothing can be"
        return Contradiction(words, f"'contains' at {path} needs an item that {what}: {missed.why}")
    limits = ("uniqueItems",) if unique else ("maxItems",)
    return Contradiction(
        _merge((least, "contains"), limits),
        f"'{least}' at {path} asks for {at_least} matching items, more than "
        f"{' and '.join(repr(k) for k in limits)} allow ({int(able)})",
    )


def _unique_empty(
    judge: _Judge, flat: list[tuple[str, dict]], items: _ItemPositions, low: int, depth: int
) -> Contradiction | None:
    if items.prefix_length or low < 2:
        return None
    values = judge._distinct_values(items.at(0))
    if values is None or len(values) >= low:
        return None
    return Contradiction(
        ("uniqueItems", "minItems", *items.keywords()),
        f"'uniqueItems' with 'minItems' {low} at {flat[0][0]} needs "
        f"{low} distinct items, and 'items' allows only {len(values)} "
        "values",
    )


def _objects_empty(judge: _Judge, flat: list[tuple[str, dict]], depth: int) -> Contradiction | None:
    where = flat[0][0]
    crossed = _crossed(flat, "minProperties", "maxProperties")
    if crossed is not None:
        return crossed
    high, high_from = _tightest(flat, "maxProperties", min, math.inf)
    required = list(
        dict.fromkeys(name for _, node in flat for name in _strings(node.get("required")))
    )
    if len(required) > high:
        return Contradiction(
            ("required", "maxProperties"),
            f"'required' at {where} "
            f"names {len(required)} properties, 'maxProperties' allows "
            f"{high} ({high_from})",
        )
    for name in required:
        for path, node in flat:
            names = node.get("propertyNames")
            if "propertyNames" not in node:
                continue
            why = judge.empty(
                [(f"{path}/propertyNames", names), (path, {"const": name})], depth + 1
            )
            if why is not None:
                failing = tuple(k for k in why.keywords if k != "const")
                return Contradiction(
                    _merge(("required", "propertyNames"), failing),
                    f"required property '{name}' is not a name 'propertyNames' at "
                    f"{path} allows (it fails {', '.join(repr(k) for k in failing)})",
                )
        value = _property_value(flat, name)
        if value is None:
            continue
        why = judge.empty(value, depth + 1)
        if why is not None:
            return Contradiction(
                _merge(("required",), why.keywords),
                f"required property '{name}' at {where} can have no value: {why.why}",
            )
    return None


# ---- the pieces ---------------------------------------------------------------------------


class _ItemPositions:
    """What each position of an array must satisfy, by every conjunct: its ``prefixItems``
    (or list-valued ``items``) entry, else its ``items`` (or ``additionalItems``)."""

    def __init__(self, flat: list[tuple[str, dict]]) -> None:
        self.rules: list[tuple[list[tuple[str, Any]], tuple[str, Any] | None]] = []
        self.used: list[str] = []
        for path, node in flat:
            prefix, rest, words = _item_rules(path, node)
            if prefix or rest is not None:
                self.rules.append((prefix, rest))
                self.used += words
        self.prefix_length = max((len(p) for p, _ in self.rules), default=0)

    def at(self, index: int) -> list[tuple[str, Any]]:
        """The schemas item ``index`` satisfies (positions past every prefix: all alike)."""
        found = []
        for prefix, rest in self.rules:
            if index < len(prefix):
                found.append(prefix[index])
            elif rest is not None:
                found.append(rest)
        return found

    def keywords(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.used))


def _item_rules(
    path: str, node: dict
) -> tuple[list[tuple[str, Any]], tuple[str, Any] | None, list[str]]:
    items = node.get("items")
    if isinstance(items, list):  # before 2020-12: items as a tuple, then additionalItems
        prefix = [(f"{path}/items/{i}", s) for i, s in enumerate(items)]
        rest = node.get("additionalItems")
        words = ["items"] + (["additionalItems"] if rest is not None else [])
        return prefix, (f"{path}/additionalItems", rest) if rest is not None else None, words
    listed = node.get("prefixItems")
    prefix = (
        [(f"{path}/prefixItems/{i}", s) for i, s in enumerate(listed)]
        if isinstance(listed, list)
        else []
    )
    words = ["prefixItems"] if prefix else []
    if isinstance(items, dict | bool):
        return prefix, (f"{path}/items", items), [*words, "items"]
    return prefix, None, words


def _property_value(flat: list[tuple[str, dict]], name: str) -> list[tuple[str, Any]] | None:
    """What property ``name``'s value satisfies, by every conjunct; ``None`` when a
    ``patternProperties`` pattern cannot be read here (whether it applies is unknown)."""
    found: list[tuple[str, Any]] = []
    for path, node in flat:
        properties = node.get("properties")
        if isinstance(properties, dict) and name in properties:
            found.append((f"{path}/properties/{escape_pointer(name)}", properties[name]))
            named = True
        else:
            named = False
        matched = False
        patterns = node.get("patternProperties")
        for pattern, schema in patterns.items() if isinstance(patterns, dict) else ():
            if not same_regex(pattern, [name]):
                return None
            try:
                hit = re.search(pattern, name) is not None
            except re.error:
                return None
            if hit:
                matched = True
                found.append((f"{path}/patternProperties/{escape_pointer(pattern)}", schema))
        if not named and not matched and "additionalProperties" in node:
            found.append((f"{path}/additionalProperties", node["additionalProperties"]))
    return found


def _numbers_empty(kind: str, flat: list[tuple[str, dict]]) -> Contradiction | None:
    low, low_open, low_word = -math.inf, False, None
    high, high_open, high_word = math.inf, False, None
    steps: list[int] = []
    for _, node in flat:
        for word, bound, opened in _lower_bounds(node):
            if bound > low or (bound == low and opened):
                low, low_open, low_word = bound, opened, word
        for word, bound, opened in _upper_bounds(node):
            if bound < high or (bound == high and opened):
                high, high_open, high_word = bound, opened, word
        step = node.get("multipleOf")
        if is_number(step) and step > 0 and float(step).is_integer():
            steps.append(int(step))
    bounds = tuple(w for w in (low_word, high_word) if w)
    if low > high or (low == high and (low_open or high_open)):
        return Contradiction(
            bounds,
            f"no number is within '{low_word}' {_short(low)} and '{high_word}' {_short(high)}",
        )
    if kind == "fraction":
        if steps:
            return Contradiction(("multipleOf",), "an integral 'multipleOf' allows integers only")
        if low == high and float(low).is_integer():
            return Contradiction(bounds, f"the only number allowed, {_short(low)}, is an integer")
        return None
    step = math.lcm(*steps) if steps else 1
    first = _first_multiple(low, low_open, step)
    if first is None or (first <= high and not (first == high and high_open)):
        return None
    words = _merge(bounds, ("multipleOf",) if steps else ())
    what = f"multiple of {step}" if steps else "integer"
    return Contradiction(
        words, f"no {what} is within '{low_word}' {_short(low)} and '{high_word}' {_short(high)}"
    )


def _lower_bounds(node: dict) -> Iterator[tuple[str, Any, bool]]:
    low, exclusive = node.get("minimum"), node.get("exclusiveMinimum")
    if is_number(low):
        yield "minimum", low, exclusive is True  # draft 4: a boolean beside minimum
    if is_number(exclusive):
        yield "exclusiveMinimum", exclusive, True


def _upper_bounds(node: dict) -> Iterator[tuple[str, Any, bool]]:
    high, exclusive = node.get("maximum"), node.get("exclusiveMaximum")
    if is_number(high):
        yield "maximum", high, exclusive is True
    if is_number(exclusive):
        yield "exclusiveMaximum", exclusive, True


def _first_multiple(low: Any, opened: bool, step: int) -> int | None:
    """The least multiple of ``step`` above ``low`` (or at it, when not ``opened``)."""
    if low == -math.inf:
        return None
    if isinstance(low, float) and not math.isfinite(low):
        return None
    start = math.floor(low) + 1 if opened else math.ceil(low)
    return -((-start) // step) * step


def _strings_empty(flat: list[tuple[str, dict]]) -> Contradiction | None:
    return _crossed(flat, "minLength", "maxLength")


def _small_domain(flat: list[tuple[str, dict]]) -> list[Any] | None:
    """Every null, boolean and integer value the conjuncts' types and bounds allow, when
    those are the only kinds and the integers are few; ``None`` otherwise."""
    kinds = set(KINDS)
    for _, node in flat:
        kinds &= kinds_of(node)
    if not kinds <= {"null", "boolean", "integer"}:
        return None
    values: list[Any] = [None] if "null" in kinds else []
    values += [False, True] if "boolean" in kinds else []
    if "integer" in kinds:
        low = max((b for _, n in flat for _, b, _ in _lower_bounds(n)), default=None)
        high = min((b for _, n in flat for _, b, _ in _upper_bounds(n)), default=None)
        if low is None or high is None or high - low > MAX_DISTINCT:
            return None
        values += list(range(math.ceil(low), math.floor(high) + 1))
    return values


def _accepts_kind(schema: Any, kind: str) -> bool:
    """Whether ``schema`` surely accepts every value of ``kind`` (so ``not`` of it rejects
    them all): ``true``, or only annotations, a ``type`` with that kind, and keywords that
    assert things of other kinds."""
    if schema is True:
        return True
    if not isinstance(schema, dict):
        return False
    own = "number" if kind in _NUMBERS else kind
    for keyword, value in schema.items():
        if keyword in ANNOTATIONS:
            continue
        if keyword == "type":
            if kind not in kinds_of({"type": value}):
                return False
        elif keyword == "format" and is_unknown_format(value):
            continue
        elif not any(keyword in words for k, words in _KIND_KEYWORDS.items() if k != own):
            return False
    return True


def _accepts_all(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and set(schema) <= ANNOTATIONS)


def _conjuncts(
    schema: Any, path: str, root: Any, ref_siblings: bool, depth: int = 0
) -> list[tuple[str, Any]]:
    """``schema`` and, through ``$ref``s and ``allOf``, every subschema each instance must
    satisfy, with where each is; ``False`` among them when one accepts nothing. A ``$ref``
    that cannot be followed here, and a loop, count as anything; its siblings count unless
    ``ref_siblings`` is false (drafts 4 to 7 ignore them)."""
    if depth > MAX_DEPTH:
        return []
    if schema is False:
        return [(path, False)]
    if not isinstance(schema, dict):
        return []
    ref = schema.get("$ref")
    found: list[tuple[str, Any]] = [] if ref is not None and not ref_siblings else [(path, schema)]
    if isinstance(ref, str):
        target = resolve_pointer(root, ref) if ref.startswith("#") else None
        if isinstance(target, dict) and {"$id", "id"} & set(target):
            target = None  # another resource: its refs resolve elsewhere
        if target is not None:
            found += _conjuncts(target, ref, root, ref_siblings, depth + 1)
    branches = schema.get("allOf")
    if isinstance(branches, list):
        for i, branch in enumerate(branches):
            found += _conjuncts(branch, f"{path}/allOf/{i}", root, ref_siblings, depth + 1)
    return found


def _siblings_of_ref_count(schema: Any) -> bool:
    """Whether keywords beside a ``$ref`` apply: from draft 2019-09 on, and without a
    ``$schema`` (as the backends read them); drafts 4 to 7 ignore them."""
    from jsonschema import validators

    if not isinstance(schema, dict) or not isinstance(schema.get("$schema"), str):
        return True
    draft = validators.validator_for(schema, default=None)
    old = (validators.Draft4Validator, validators.Draft6Validator, validators.Draft7Validator)
    return draft not in old


def _failing_keywords(node: dict, root: Any, values: list[Any]) -> tuple[str, ...]:
    """The keywords ``jsonschema`` names for the values it refuses (the first few values)."""
    from jsonschema import validators

    cls = validators.validator_for(root, default=validators.Draft202012Validator)
    found: list[str] = []
    try:
        check = cls(root).evolve(schema=node)
        for value in values[:8]:
            found += [e.validator for e in check.iter_errors(value)]
    except Exception:
        return ()
    return tuple(dict.fromkeys(k for k in found if k not in ("allOf", "$ref")))


def _values_are(node: dict, keyword: str, values: list[Any]) -> bool:
    if keyword not in node:
        return False
    own = [node["const"]] if keyword == "const" else node["enum"]
    return own is values or own == values


def _crossed(flat: list[tuple[str, dict]], least: str, most: str) -> Contradiction | None:
    """The contradiction when the tightest ``least`` count bound of the conjuncts is above
    their tightest ``most`` (``minItems`` / ``maxItems``...)."""
    low, low_from = _tightest(flat, least, max, 0)
    high, high_from = _tightest(flat, most, min, math.inf)
    if low <= high:
        return None
    why = f"'{least}' {low} ({low_from}) is above '{most}' {high} ({high_from})"
    return Contradiction((least, most), why)


def _tightest(flat: list[tuple[str, dict]], keyword: str, pick: Any, default: Any) -> tuple:
    """The tightest value of ``keyword`` among the conjuncts, and where it is."""
    best, where = default, None
    for path, node in flat:
        value = node.get(keyword)
        if is_int(value) and pick(value, best) == value and value != best:
            best, where = value, path
    return best, where


def _false_at(path: str) -> Contradiction:
    """A ``false`` subschema, named by the keyword that holds it (``items``...)."""
    words = [w for w in path.split("/")[1:] if not w.isdigit()]
    keyword = next((w for w in reversed(words) if w in _HOLDERS), "false")
    if keyword in ("$defs", "definitions"):
        keyword = "$ref"  # reached through one
    return Contradiction((keyword,), f"the schema at {path} is false")


# Keywords whose value is a subschema, or holds subschemas.
_HOLDERS = frozenset(
    {"items", "prefixItems", "additionalItems", "contains", "properties", "patternProperties",
     "additionalProperties", "propertyNames", "allOf", "anyOf", "oneOf", "not", "$defs",
     "definitions", "dependentSchemas", "then", "else"}
)  # fmt: skip


def _without(node: dict, keyword: str) -> dict:
    return {k: v for k, v in node.items() if k != keyword}


def _all_of(nodes: list[dict]) -> dict:
    return nodes[0] if len(nodes) == 1 else {"allOf": list(nodes)}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _merge(*groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for group in groups for k in group))


def _short(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
