"""``uniqueItems`` and ``contains``: the array keywords no backend enforces, found in a schema
and taken out of it, to be checked while the output is written (``checked_matcher.py``).

``plan_checks`` returns the schema without ``uniqueItems`` / ``contains`` / ``minContains`` /
``maxContains`` (a backend enforces the rest) and a ``CheckPlan``: which arrays of an instance
the removed keywords apply to, followed by instance location. A subschema applies at a
location through ``properties``, ``patternProperties``, ``additionalProperties``, ``items``,
``prefixItems``, ``additionalItems`` and ``contains``, and in place through ``allOf``,
``anyOf``, ``oneOf``, ``then``, ``else``, ``dependentSchemas`` / ``dependencies`` and local
``$ref``s. The set of subschemas reached is a superset of those the instance is judged by
(an ``anyOf`` branch it does not take is in it too), so an array gets every check any of them
asks for: sometimes more than the schema asks, never less.

Why that is sound: let ``S'`` be any subschema with the keywords removed. For an instance
that passes every check, each removed keyword holds wherever it appears, so the instance is
valid against ``S'`` exactly when it is valid against ``S``, under ``oneOf`` too. So the
backend's verdict on the stripped schema plus the checks accept only valid instances.
Keywords under ``not``, ``if`` or ``propertyNames``, beside ``unevaluated*``, dynamic or
remote references, or ``$ref``s inside nested ``$id`` resources are refused by name.

Example::

    >>> stripped, plan = plan_checks('{"type": "array", "uniqueItems": true}', "auto")
    >>> stripped, plan.rules(plan.root).unique
    ('{"type": "array"}', True)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import validators

from constrained.errors import GrammarError
from constrained.schema.negation import conjuncts, kinds_of, values_of
from constrained.schema.walk import (
    iter_subschemas,
    nested_resources,
    reachable_subschemas,
    resolve_pointer,
)

CHECKED = ("uniqueItems", "contains", "minContains", "maxContains")
MAX_MEMO = 4096  # CheckPlan.child results kept
MAX_FINITE_ITEMS = 256  # item values written out for the look-ahead (``ArrayRules.finite``)
_IN_PLACE = ("allOf", "anyOf", "oneOf")
# Where a subschema may or may not apply (so its ``items`` may not bound the values).
_ALTERNATIVES = frozenset(
    {"anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "dependencies", "prefixItems"}
)
_OLD_DRAFTS = (validators.Draft3Validator, validators.Draft4Validator)  # no ``contains``
_BEFORE_2019 = (*_OLD_DRAFTS, validators.Draft6Validator, validators.Draft7Validator)

NodeSet = frozenset  # of id()s of schema objects, each held by ``CheckPlan.nodes``
Signature = tuple[tuple[int, ...], tuple[int, ...]]  # contains matched (strictly, loosely)


@dataclass(frozen=True)
class Contains:
    """One ``contains``: at least ``at_least`` and at most ``at_most`` items match ``schema``."""

    schema: Any
    at_least: int
    at_most: int | None


@dataclass(frozen=True)
class ArrayRules:
    """The checks one array gets.

    Attributes:
        unique: ``uniqueItems`` (no two items equal as JSON values).
        contains: each ``contains`` that applies.
        finite: when the items are a few plain scalars (an ``enum`` of strings without
            escapes, bounded integers, booleans, ``null``): each value's canonical key and
            compact JSON bytes, so an item that no value still allowed starts with (unused,
            for ``uniqueItems``; not one match too many, for ``maxContains``) is refused
            before it is complete (breaking a check would otherwise be the only way on).
        min_items / max_items: the array's ``minItems`` / ``maxItems`` where every subschema
            reaching it applies (none under ``anyOf`` & co.), for counting what the checks
            still need against the room left (``completable``).
    """

    unique: bool
    contains: tuple[Contains, ...]
    finite: tuple[tuple[Any, bytes], ...] | None
    min_items: int = 0
    max_items: int | None = None


def canonical(value: Any) -> Any:
    """A hashable key equal for JSON values JSON Schema calls equal (``1`` and ``1.0``, objects
    in any key order; ``true`` and ``1`` differ), as ``jsonschema`` judges ``uniqueItems``: numbers
    as Python reads them (``0.1`` and ``0.10000000000000001`` are one float)."""
    if isinstance(value, bool):
        return ("b", value)
    if value is None:
        return ("z",)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(canonical(v) for v in value))
    return ("o", frozenset((k, canonical(v)) for k, v in value.items()))


def canonical_text(text: bytes) -> Any:
    """``canonical`` of a JSON text."""
    if text[:1] == b'"' and 0x5C not in text:  # a string without escapes: the hot case
        return ("s", text[1:-1].decode())
    return canonical(json.loads(text))


class CheckPlan:
    """Which checks each array of an instance gets, by the subschemas reaching it.

    ``root`` is the set at the instance's root; ``child(nodes, key_or_index)`` the set at a
    member or item; ``rules(nodes)`` an array's checks there (``None``: none). Sets are
    ``frozenset``s of subschema ids; both maps are memoized.
    """

    def __init__(self, schema: Any, draft: Any) -> None:
        self.schema = schema
        self.draft = draft
        self.nodes: dict[int, dict] = {}
        self.prefixed = draft in (None, validators.Draft202012Validator)  # has prefixItems
        self.root = self._closure([schema])
        self._children: dict[tuple[NodeSet, Any], NodeSet] = {}
        self._rules: dict[NodeSet, ArrayRules | None] = {}
        self._validators: dict[tuple[int, bool], Any] = {}
        self._signatures: dict[int, tuple] = {}
        self._satisfiable: dict[int, bool] = {}
        #: Some subschema asks for checks no array meets but allows other values: the checks
        #: refuse the ``[`` opening such an array (``satisfiable``).
        self.dead_arrays = False

    def _closure(self, schemas: list[Any]) -> NodeSet:
        """The schema objects in ``schemas`` and those applying in place with them."""
        found: set[int] = set()
        pending = [s for s in schemas if isinstance(s, dict)]
        while pending:
            node = pending.pop()
            if id(node) in found:
                continue
            found.add(id(node))
            self.nodes[id(node)] = node
            pending += [s for s in _in_place(node, self.schema) if isinstance(s, dict)]
        return frozenset(found)

    def ordered(self, nodes: NodeSet) -> list[dict]:
        """The subschemas of ``nodes`` in the order the plan found them: a set of ``id()``s
        iterates in the order of their addresses, which differ from process to process."""
        return [node for key, node in self.nodes.items() if key in nodes]

    def child(self, nodes: NodeSet, at: str | int) -> NodeSet:
        """The subschemas applying to member ``at`` (a key) or item ``at`` (an index)."""
        if not nodes:
            return nodes
        memo = self._children.get((nodes, at))
        if memo is None:
            found: list[Any] = []
            for node in self.ordered(nodes):
                found += (
                    _members(node, at) if isinstance(at, str) else _items(node, at, self.prefixed)
                )
            if len(self._children) >= MAX_MEMO:  # keys and indexes the model invents
                self._children.clear()
            memo = self._children[(nodes, at)] = self._closure(found)
        return memo

    def rules(self, nodes: NodeSet) -> ArrayRules | None:
        """The checks of an array the subschemas ``nodes`` reach."""
        if nodes not in self._rules:
            self._rules[nodes] = self._rules_of(self.ordered(nodes))
        return self._rules[nodes]

    def _rules_of(self, nodes: list[dict]) -> ArrayRules | None:
        unique = any(n.get("uniqueItems") is True and not _at_most_one(n) for n in nodes)
        modern = self.draft not in _BEFORE_2019
        found: list[Contains] = []
        for node in nodes:
            if "contains" not in node or self.draft in _OLD_DRAFTS:
                continue
            at_least, at_most = 1, None
            if modern:
                at_least = _count(node.get("minContains"), 1)
                at_most = _count(node.get("maxContains"), None)
            if at_least > 0 or at_most is not None:
                found.append(Contains(node["contains"], at_least, at_most))
        if not unique and not found:
            return None
        low, high = _item_bounds(nodes)
        return ArrayRules(unique, tuple(found), self._finite(nodes), low, high)

    def _finite(self, nodes: list[dict]) -> tuple[tuple[Any, bytes], ...] | None:
        items = {id(n["items"]): n["items"] for n in nodes if isinstance(n.get("items"), dict)}
        if len(items) != 1 or any(_ALTERNATIVES & n.keys() for n in nodes):
            return None  # an ``anyOf`` branch's items may not be the instance's
        (schema,) = items.values()
        values: list[Any] | None = None
        for conjunct in conjuncts(schema, self.schema):
            found = _values_within(conjunct) if isinstance(conjunct, dict) else None
            if found is not None and (values is None or len(found) < len(values)):
                values = found
        if values is None or len(values) > MAX_FINITE_ITEMS or not all(map(_plain, values)):
            return None
        written = {canonical(v): json.dumps(v).encode() for v in values}
        return tuple(written.items())

    def matches(self, contains: Contains, value: Any, strict: bool) -> bool:
        """Whether an item counts for ``contains``, judged with the schema's draft: ``strict``
        with format assertions (for ``minContains``: never a match some reading rejects),
        else without (for ``maxContains``: every match any reading counts)."""
        check = self._validators.get((id(contains.schema), strict))
        if check is None:
            cls = self.draft or validators.Draft202012Validator
            checker = cls.FORMAT_CHECKER if strict else None
            check = cls(self.schema, format_checker=checker).evolve(schema=contains.schema)
            self._validators[(id(contains.schema), strict)] = check
        return bool(check.is_valid(value))

    def satisfiable(self, rules: ArrayRules, memo: bool = True) -> bool:
        """Whether some array meets ``rules`` (with its item domain, if finite)."""
        known = self._satisfiable.get(id(rules)) if memo else None
        if known is None:
            known = completable(0, rules, (0,) * len(rules.contains), (0,) * len(rules.contains),
                                self._all_classes(rules))  # fmt: skip
            known = known and not any(c.at_least > 0 and c.schema is False for c in rules.contains)
            if memo:
                self._satisfiable[id(rules)] = known
        return known

    def _all_classes(self, rules: ArrayRules) -> dict[Signature, int | None] | None:
        if rules.finite is None:
            return None
        found = [(k, t, self.signature(rules, json.loads(t))) for k, t in rules.finite]
        return _classes(found, rules.unique)

    def signatures(self, rules: ArrayRules) -> tuple[tuple[Any, bytes, Signature], ...]:
        """Each value of ``rules.finite``: its key, its text and which ``contains`` it
        matches (strictly, loosely); memoized."""
        memo = self._signatures.get(id(rules))
        if memo is None:
            memo = tuple(
                (key, text, self.signature(rules, json.loads(text))) for key, text in rules.finite
            )
            self._signatures[id(rules)] = memo
        return memo

    def signature(self, rules: ArrayRules, value: Any) -> Signature:
        """Which of ``rules.contains`` ``value`` matches: (strictly, loosely)."""
        strict = tuple(int(self.matches(c, value, True)) for c in rules.contains)
        loose = tuple(int(self.matches(c, value, False)) for c in rules.contains)
        return strict, loose

    def values_left(
        self, rules: ArrayRules, count: int, seen: frozenset, matched: tuple, loose: tuple
    ) -> list[bytes]:
        """Over a finite item domain, the values (JSON bytes, sorted) the next item may take
        so that the array can still be completed (``completable``): unused (``uniqueItems``),
        not one match too many (``maxContains``), leaving room for the matches still needed
        and for ``minItems``."""
        signatures = self.signatures(rules)
        unused = [(k, t, sig) for k, t, sig in signatures if not (rules.unique and k in seen)]
        classes = _classes(unused, rules.unique)
        verdicts: dict[Signature, bool] = {}
        left = []
        for _, text, (strict, looser) in unused:
            ok = verdicts.get((strict, looser))
            if ok is None:
                taken = {sig: cap - (sig == (strict, looser)) if cap is not None else None
                         for sig, cap in classes.items()}  # fmt: skip
                ok = verdicts[(strict, looser)] = completable(
                    count + 1,
                    rules,
                    tuple(m + s for m, s in zip(matched, strict, strict=True)),
                    tuple(n + s for n, s in zip(loose, looser, strict=True)),
                    taken,
                )
            if ok:
                left.append(text)
        return sorted(left)


def plan_checks(text: str, backend: str) -> tuple[str, CheckPlan] | None:
    """The schema without the array keywords no backend enforces, and where they apply;
    ``None`` when it has none.

    Raises:
        GrammarError: a keyword sits where it cannot be followed (see the module docstring),
            naming it.
    """
    schema = json.loads(text)
    if not isinstance(schema, dict):
        return None
    found = [(path, key, node) for path, node in _all_subschemas(schema) for key in CHECKED
             if key in node]  # fmt: skip
    if not found:
        return None
    draft = validators.validator_for(schema, default=None) if "$schema" in schema else None
    _refuse_unfollowed(schema, found, backend)
    plan = CheckPlan(schema, draft)
    _refuse_unsatisfiable(plan, found, backend)
    stripped = copy.deepcopy(schema)
    _strip(stripped)
    return json.dumps(stripped, ensure_ascii=False), plan


def _all_subschemas(schema: Any) -> Iterator[tuple[str, dict]]:
    """Every subschema, and what local ``$ref``s reach outside the tree (OpenAPI-style
    ``#/components/...``, through chains of them), each once."""
    return reachable_subschemas(schema)


def _local_refs(schema: Any) -> Iterator[tuple[dict, str]]:
    for _, node in iter_subschemas(schema):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            yield node, ref


def _refuse_unfollowed(schema: dict, found: list[tuple[str, str, dict]], backend: str) -> None:
    def refuse(keyword: str, where: str, why: str) -> None:
        raise GrammarError(
            backend, f"cannot enforce keyword '{keyword}' (at {where}): {why}", keyword=keyword
        )

    first, keyword, _ = found[0]
    for path, node in _all_subschemas(schema):
        for key in ("$dynamicRef", "$recursiveRef", "unevaluatedItems", "unevaluatedProperties"):
            if key in node:
                refuse(keyword, first, f"the schema uses {key} ({path})")
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            refuse(keyword, first, f"a $ref that is not local ({path})")
        if isinstance(ref, str) and not isinstance(resolve_pointer(schema, ref), (dict, bool)):
            refuse(keyword, first, f"a $ref that does not resolve ({path})")
    for path, resource in nested_resources(schema):  # its $refs resolve against its $id
        if any(True for _ in _local_refs(resource)):
            refuse(keyword, first, f"a $ref inside a nested $id resource ({path})")
    negated = _negated(schema)
    for path, key, node in found:
        if id(node) in negated:
            refuse(key, path, "it sits under not, if or propertyNames")


def _refuse_unsatisfiable(
    plan: CheckPlan, found: list[tuple[str, str, dict]], backend: str
) -> None:
    """Refuse a subschema that must be an array and whose checked keywords no array meets
    with its own (and its ``allOf`` / ``$ref``) ``items``, ``minItems`` and ``maxItems``: the
    backend lets such an array be written and the checks would refuse every way on inside
    it (a dead end). Where the subschema also allows other values, the checks refuse the
    ``[`` that would open such an array (``CheckPlan.dead_arrays``)."""
    done: set[int] = set()
    for path, _, node in found:
        if id(node) in done:
            continue
        done.add(id(node))
        closure = plan.ordered(plan._closure([node]))
        rules = plan._rules_of(closure)
        if rules is None or plan.satisfiable(rules):
            continue
        if not any(kinds_of(n) == {"array"} for n in closure):
            plan.dead_arrays = True
            continue
        relaxed = [
            ("uniqueItems", dataclasses.replace(rules, unique=False)),
            ("maxContains", _with_contains(rules, lambda c: (c.at_least, None))),
            ("minContains", _with_contains(rules, lambda c: (min(c.at_least, 1), c.at_most))),
        ]
        keyword = next(
            (k for k, r in relaxed if r != rules and plan.satisfiable(r, memo=False)), "contains"
        )
        bounds = f"minItems {rules.min_items}, maxItems {rules.max_items}"
        domain = "" if rules.finite is None else f", {len(rules.finite)} possible item values"
        raise GrammarError(
            backend,
            f"keyword '{keyword}' (at {path}) is unsatisfiable with the array's items "
            f"({bounds}{domain}): no array meets it, and the checks cannot keep the output "
            "out of a dead end",
            keyword=keyword,
        )


def _with_contains(rules: ArrayRules, counts: Any) -> ArrayRules:
    """``rules`` with each ``contains``' (at_least, at_most) changed to ``counts(it)``."""
    return dataclasses.replace(
        rules, contains=tuple(Contains(c.schema, *counts(c)) for c in rules.contains)
    )


def _negated(schema: dict) -> set[int]:
    """Ids of the subschemas under ``not``, ``if`` or ``propertyNames`` (through ``$ref``s):
    judged there, a removed keyword would change the verdict the other way."""
    found: set[int] = set()
    for _, node in _all_subschemas(schema):
        for key in ("not", "if", "propertyNames"):
            if isinstance(node.get(key), dict):
                found.update(id(sub) for _, sub in reachable_subschemas(node[key], schema))
    return found


def _in_place(node: dict, root: Any) -> list[Any]:
    """The subschemas applying to the same instance as ``node`` (``not`` / ``if`` aside)."""
    found: list[Any] = []
    for key in _IN_PLACE:
        if isinstance(node.get(key), list):
            found += node[key]
    found += [node.get("then"), node.get("else")]
    for key in ("dependentSchemas", "dependencies"):
        if isinstance(node.get(key), dict):
            found += [v for v in node[key].values() if isinstance(v, dict)]
    ref = node.get("$ref")
    if isinstance(ref, str):
        found.append(resolve_pointer(root, ref))
    return found


def _members(node: dict, key: str) -> list[Any]:
    found: list[Any] = []
    properties = node.get("properties")
    named = isinstance(properties, dict) and key in properties
    if named:
        found.append(properties[key])
    patterns = node.get("patternProperties")
    matched = False
    if isinstance(patterns, dict):
        for pattern, sub in patterns.items():
            try:
                hit = re.search(pattern, key) is not None
            except re.error:  # a dialect Python cannot read: assume it matches
                hit = True
            if hit:
                found.append(sub)
                matched = True
    if not named and not matched:
        found.append(node.get("additionalProperties"))
    return found


def _items(node: dict, index: int, prefixed: bool) -> list[Any]:
    found: list[Any] = [node.get("contains")]
    prefix = node.get("prefixItems") if prefixed else None
    items = node.get("items")
    if isinstance(prefix, list) and index < len(prefix):
        found.append(prefix[index])
    elif isinstance(items, list):
        found.append(items[index] if index < len(items) else node.get("additionalItems"))
    else:
        found.append(items)
    return found


def completable(
    count: int,
    rules: ArrayRules,
    matched: tuple[int, ...],
    loose: tuple[int, ...],
    classes: dict[Signature, int | None] | None = None,
) -> bool:
    """Whether an array with ``count`` items, ``matched`` / ``loose`` matches of each
    ``rules.contains``, can still be completed: items added (``classes``: how many values
    left of each signature, ``None`` for no limit; without it any signature is assumed
    possible) reach ``minItems`` and every ``minContains`` within ``maxItems`` without
    going past a ``maxContains``.

    A ``maxItems`` the array is already past was not the array's (a subschema that may
    not apply): it is ignored.
    """
    contains = rules.contains
    rooms = tuple(
        None if c.at_most is None else c.at_most - n for c, n in zip(contains, loose, strict=True)
    )
    if any(r is not None and r < 0 for r in rooms):
        return False
    needs = tuple(max(0, c.at_least - n) for c, n in zip(contains, matched, strict=True))
    high = rules.max_items
    room = None if high is None or count > high else high - count
    low = max(0, rules.min_items - count)
    if classes is None:  # any item possible: each need within the room, each match allowed
        if room is not None and (max(needs, default=0) > room or low > room):
            return False
        return all(n == 0 or r is None or r >= n for n, r in zip(needs, rooms, strict=True))
    order = sorted(classes.items(), key=lambda pair: -sum(pair[0][0]))
    return _search(order, 0, 0, low, room, needs, rooms, {})


def _search(
    order: list, at: int, total: int, low: int, room: int | None, needs: tuple, rooms: tuple,
    memo: dict,
) -> bool:  # fmt: skip
    """``completable``'s search: how many items of each signature, from ``order[at]`` on."""
    if total >= low and not any(needs):
        return True
    if at == len(order):
        return False
    key = (at, total, needs, rooms)
    if key in memo:
        return memo[key]
    (strict, looser), cap = order[at]
    useful = max(low - total, max((n for n, s in zip(needs, strict, strict=True) if s), default=0))
    most = useful if cap is None else min(cap, useful)
    if room is not None:
        most = min(most, room - total)
    for r, bit in zip(rooms, looser, strict=True):
        if bit and r is not None:
            most = min(most, r)
    found = False
    for x in range(max(most, 0), -1, -1):
        after_needs = tuple(max(0, n - x * s) for n, s in zip(needs, strict, strict=True))
        after_rooms = tuple(
            None if r is None else r - x * b for r, b in zip(rooms, looser, strict=True)
        )
        if _search(order, at + 1, total + x, low, room, after_needs, after_rooms, memo):
            found = True
            break
    memo[key] = found
    return found


def _classes(
    values: list[tuple[Any, bytes, Signature]], unique: bool
) -> dict[Signature, int | None]:
    """How many values of each signature (``None``: unlimited, without ``uniqueItems``)."""
    classes: dict[Signature, int | None] = {}
    for _, _, sig in values:
        classes[sig] = (classes.get(sig) or 0) + 1 if unique else None
    return classes


def _item_bounds(nodes: list[dict]) -> tuple[int, int | None]:
    """``minItems`` / ``maxItems`` of an array every one of ``nodes`` applies to (none
    when one may not: an ``anyOf`` branch, ``then`` ...)."""
    if any(_MAYBE & n.keys() for n in nodes):
        return 0, None
    lows = [_count(n.get("minItems"), None) for n in nodes]
    highs = [_count(n.get("maxItems"), None) for n in nodes]
    lows = [v for v in lows if v is not None]
    highs = [v for v in highs if v is not None]
    return max(lows, default=0), min(highs, default=None)


_MAYBE = _ALTERNATIVES - {"prefixItems"}


def _strip(node: Any) -> None:
    """Remove the checked keywords from every subschema of ``node`` (in place)."""
    for _, sub in _all_subschemas(node):
        for key in CHECKED:
            sub.pop(key, None)


def _values_within(schema: dict) -> list[Any] | None:
    """Every value ``schema`` may allow, when few: its ``enum`` / ``const``, the integers
    between its bounds, ``true`` and ``false``, or ``null`` (a superset: the look-ahead only
    refuses what no value of it starts)."""
    values = values_of(schema)
    if values is not None:
        return values
    kind = schema.get("type")
    if kind == "boolean":
        return [False, True]
    if kind == "null":
        return [None]
    if kind != "integer":
        return None
    low, high = (
        _bound(schema, "minimum", "exclusiveMinimum"),
        _bound(schema, "maximum", "exclusiveMaximum"),
    )
    if low is None or high is None or high - low >= MAX_FINITE_ITEMS:
        return None
    return list(range(low, high + 1))


def _bound(schema: dict, inclusive: str, exclusive: str) -> int | None:
    """The integer bound ``schema`` sets on one side (the tighter of the two keywords)."""
    lower = inclusive == "minimum"
    found = []
    for key, shift in ((inclusive, 0), (exclusive, 1)):
        value = schema.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # draft 4's boolean exclusive flags: no bound of their own
        if lower:
            found.append(math.floor(value) + shift if value == int(value) else math.ceil(value))
        else:
            found.append(math.ceil(value) - shift if value == int(value) else math.floor(value))
    if not found:
        return None
    return max(found) if lower else min(found)


def _at_most_one(node: dict) -> bool:
    limit = node.get("maxItems")
    return isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit <= 1


def _count(value: Any, default: int | None) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return default
    return int(value)


def _plain(value: Any) -> bool:
    """A scalar that JSON writes one way: ``json.dumps`` is what any backend allows."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return True
    if isinstance(value, str):
        return all(0x20 <= ord(ch) < 0x7F and ch not in '"\\' for ch in value)
    return False


MAX_SAMPLES = 12  # candidate values ``sample_values`` returns
_FORMATS = {
    "date": "2020-01-01", "date-time": "2020-01-01T00:00:00Z", "time": "00:00:00Z",
    "email": "a@b.co", "idn-email": "a@b.co", "hostname": "a.co", "idn-hostname": "a.co",
    "ipv4": "1.1.1.1", "ipv6": "::1", "uri": "http://a.co", "iri": "http://a.co",
    "uri-reference": "a", "iri-reference": "a", "uuid": "00000000-0000-0000-0000-000000000000",
    "duration": "P1D", "json-pointer": "", "relative-json-pointer": "0", "regex": "a",
}  # fmt: skip


def sample_values(schemas: list[Any], root: Any, depth: int = 0) -> list[Any]:
    """A few values meant to satisfy every one of ``schemas`` (a guess, not a proof: the
    caller checks each): their ``const`` / ``enum``, else small values of a type they all
    allow, objects with their required members. For steering an item into a ``contains``
    match (``grammars/checked_contains.py``)."""
    flat: list[dict] = []
    for schema in schemas:
        for conjunct in conjuncts(schema, root):
            if conjunct is False:
                return []
            if isinstance(conjunct, dict):
                flat.append(conjunct)
    if depth > 4:
        return []
    for at, node in enumerate(flat):
        branches = node.get("anyOf") or node.get("oneOf")
        if isinstance(branches, list) and branches:
            rest = [n for i, n in enumerate(flat) if i != at]
            bare = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
            found: list[Any] = []
            for branch in branches[:6]:
                found += sample_values([*rest, bare, branch], root, depth + 1)
            return _distinct(found)
    for node in flat:
        values = values_of(node)
        if values is not None:
            return _distinct(values)
    kinds = set(KIND_ORDER)
    for node in flat:
        kinds &= kinds_of(node)
    found = []
    for kind in KIND_ORDER:
        if kind in kinds:
            found += _samples_of(kind, flat, root, depth)
    return _distinct(found)


KIND_ORDER = ("object", "string", "integer", "fraction", "boolean", "null", "array")


def _samples_of(kind: str, flat: list[dict], root: Any, depth: int) -> list[Any]:
    if kind == "object":
        required = {k for n in flat for k in n.get("required", ()) if isinstance(k, str)}
        named = {
            k
            for n in flat
            for k, v in (n.get("properties") or {}).items()
            if isinstance(v, dict) and ("const" in v or "enum" in v)
        }
        found = []
        for keys in (sorted(required), sorted(required | named)):
            value = {}
            for key in keys:
                subs = [_member(n, key) for n in flat]
                options = sample_values([s for s in subs if s is not None], root, depth + 1)
                if not options:
                    break
                value[key] = options[0]
            else:
                found.append(value)
        return found
    if kind == "string":
        low = max((_count(n.get("minLength"), 0) for n in flat), default=0)
        formats = [n["format"] for n in flat if n.get("format") in _FORMATS]
        if formats:
            return [_FORMATS[formats[0]]]
        return ["a" * low, *(c * max(low, 1) for c in "xyzbc")]
    if kind in ("integer", "fraction"):
        lows = [_bound(n, "minimum", "exclusiveMinimum") for n in flat]
        highs = [_bound(n, "maximum", "exclusiveMaximum") for n in flat]
        low = max((v for v in lows if v is not None), default=None)
        high = min((v for v in highs if v is not None), default=None)
        start = low if low is not None else (min(0, high) if high is not None else 0)
        steps = [m for n in flat if isinstance(m := n.get("multipleOf"), int) and m > 0]
        step = steps[0] if steps else 1
        start = -(-start // step) * step
        values = [start + i * step for i in range(6)]
        return [v for v in values if high is None or v <= high]
    if kind == "boolean":
        return [True, False]
    if kind == "null":
        return [None]
    low = max((_count(n.get("minItems"), 0) for n in flat), default=0)
    if not low:
        return [[]]
    items = [n["items"] for n in flat if isinstance(n.get("items"), dict)]
    options = sample_values(items, root, depth + 1)
    return [[options[i % len(options)] for i in range(low)]] if options else []


def _member(node: dict, key: str) -> Any:
    properties = node.get("properties")
    if isinstance(properties, dict) and key in properties:
        return properties[key]
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, dict) or extra is False else None


def _distinct(values: list[Any]) -> list[Any]:
    seen, found = set(), []
    for value in values:
        try:
            key = canonical(value)
        except TypeError:
            continue
        if key not in seen:
            seen.add(key)
            found.append(value)
    return found[:MAX_SAMPLES]
