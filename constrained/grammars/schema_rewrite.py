"""Rewrite JSON-Schema keywords no backend enforces into ones they do, exactly.

A rewritten schema accepts exactly the instances the original accepts: every rule below is
an identity of JSON Schema, and a keyword none of them can express is left where it is, so
the backend refuses it by name as before. Applied by ``auto.compile_with`` only after a
backend refused the schema as written, so a schema that compiled before compiles the same.

Rules (``S`` any subschema, ``¬`` the negation built by ``negate``):

- Keywords no instance can fail are dropped: a ``format`` JSON Schema does not define
  (``int32``, ``color``...), ``uniqueItems`` that is false or with ``maxItems`` of 0 or 1,
  ``propertyNames`` that accepts every string.
- ``if``/``then``/``else``: ``anyOf [allOf [if, then], allOf [¬if, else]]``; without ``if``,
  ``then`` and ``else`` assert nothing and are dropped.
- ``dependentRequired {a: [b, ...]}`` (and list-valued ``dependencies``): an object without
  ``a``, or with ``a, b, ...``. ``dependentSchemas {a: S}`` (schema-valued ``dependencies``):
  not an object with ``a``, or ``allOf [{required: [a]}, S]``.
- ``not S``: ``¬S``, within the types the node's own ``type`` allows.
- ``oneOf [A, B, ...]``: branches that provably share no instance become ``anyOf``
  (``apart``: by type, ``const``/``enum``, and for objects a required discriminator or a
  closed object lacking a key the other requires); otherwise each branch is
  ``allOf [A, ¬B, ...]``, ``¬B`` taken only over the types ``A`` and ``B`` may share (and,
  when ``A`` is a closed object, "a key ``B`` does not allow" is one of ``A``'s own keys).

``negate(S, types)`` is exact: ``¬(k1 ∧ k2 ∧ ...) = ¬k1 ∨ ¬k2 ∨ ...`` over ``S``'s keywords,
each keyword negated only over the types it applies to (``minLength: 3`` fails only strings:
``¬`` is strings of length 2 or less); ``¬{enum: [...]}`` writes the strings other than the
excluded ones as a pattern (``strings_other_than``); a ``$ref`` is negated through its
target. It returns ``None`` for what cannot be negated exactly (``pattern``, ``multipleOf``,
``uniqueItems``, ``patternProperties``, a known ``format``, an array or object ``enum``,
``not {type: integer}`` over numbers, ...).

Example::

    >>> rewrite_schema({"type": "string", "not": {"maxLength": 2}})
    {'type': 'string', 'allOf': [{'type': 'string', 'minLength': 3}]}
    >>> rewrite_schema({"dependentRequired": {"a": ["b"]}})["anyOf"][1]
    {'required': ['a', 'b']}
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Any

from constrained.grammars.schema_walk import (
    ANNOTATIONS,
    VALIDATION_KEYWORDS,
    escape_pointer,
    is_number,
    is_unknown_format,
    json_type,
    map_subschemas,
    resolve_pointer,
    same_json,
)

# Instance kinds: JSON Schema's types, with numbers split so ``integer`` has a complement.
KINDS = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
_KINDS_OF_TYPE = {
    "null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
    "string": {"string"}, "integer": {"integer"}, "number": {"integer", "fraction"},
}  # fmt: skip

# Keywords that assert something of one kind of instance only, and the keyword with the
# opposite bound: ``¬{minLength: n}`` is ``{type: string, maxLength: n - 1}``.
_BOUNDS: dict[str, tuple[frozenset[str], str, int]] = {
    "minLength": (frozenset({"string"}), "maxLength", -1),
    "maxLength": (frozenset({"string"}), "minLength", +1),
    "minItems": (frozenset({"array"}), "maxItems", -1),
    "maxItems": (frozenset({"array"}), "minItems", +1),
    "minProperties": (frozenset({"object"}), "maxProperties", -1),
    "maxProperties": (frozenset({"object"}), "minProperties", +1),
}
_NUMERIC_BOUNDS = {
    "minimum": "exclusiveMaximum", "exclusiveMinimum": "maximum",
    "maximum": "exclusiveMinimum", "exclusiveMaximum": "minimum",
}  # fmt: skip
_NUMBERS = frozenset({"integer", "fraction"})
MAX_ONE_OF_BRANCHES = 8  # oneOf by negation costs n² negations


def rewrite_schema_text(text: str) -> str:
    """``rewrite_schema`` over JSON text; the same text when nothing was rewritten."""
    schema = json.loads(text)
    rewritten = rewrite_schema(schema)
    return text if rewritten == schema else json.dumps(rewritten, ensure_ascii=False)


def rewrite_schema(schema: Any) -> Any:
    """A copy of ``schema`` with every keyword the rules above express rewritten.

    A schema using ``unevaluatedProperties`` / ``unevaluatedItems`` is returned as it is:
    what they allow depends on which subschemas evaluated a property, which rewriting
    ``if`` or ``oneOf`` into ``anyOf`` would change.
    """
    if _uses_unevaluated(schema):
        return schema
    schema = copy.deepcopy(schema)
    return _Rewriter(schema, _local_refs(schema)).node(schema, "#")


class _Rewriter:
    def __init__(self, root: Any, refs: set[str]) -> None:
        self.root = root
        self.refs = refs  # a keyword a $ref points into keeps its place

    def node(self, schema: Any, path: str) -> Any:
        if not isinstance(schema, dict):
            return schema
        added: list[Any] = []
        inner = schema.get("not")
        if _only_keyword(inner, "not") and not self._pointed_into(path, "not"):
            added.append(self.node(schema.pop("not")["not"], f"{path}/not/not"))  # ¬¬S = S
        map_subschemas(schema, path, self.node)  # bottom-up: children first
        for keywords, rule in (
            (("if", "then", "else"), self._if_then_else),
            (("dependencies",), self._dependencies),
            (("dependentRequired",), self._dependencies),
            (("dependentSchemas",), self._dependencies),
            (("not",), self._not),
            (("oneOf",), self._one_of),
        ):
            if keywords[0] in schema and not any(self._pointed_into(path, k) for k in keywords):
                done = rule(schema, keywords[0])
                if done is not None:
                    added.extend(done)
        for keyword in _asserting_nothing(schema):
            if not self._pointed_into(path, keyword):
                del schema[keyword]
        if "if" not in schema and not any(self._pointed_into(path, k) for k in ("then", "else")):
            schema.pop("then", None), schema.pop("else", None)  # no effect without "if"
        return _conjoin(schema, added)

    def _pointed_into(self, path: str, keyword: str) -> bool:
        prefix = f"{path}/{escape_pointer(keyword)}"
        return any(ref == prefix or ref.startswith(prefix + "/") for ref in self.refs)

    def _if_then_else(self, schema: dict, _: str) -> list[Any] | None:
        condition = schema["if"]
        if "then" not in schema and "else" not in schema:
            del schema["if"]  # asserts nothing alone
            return []
        negated = negate(condition, _kinds_of(schema), self.root)
        if negated is None:
            return None
        branches = [
            _all_of([condition, schema.get("then", True)]),
            _all_of([negated, schema.get("else", True)]),
        ]
        for key in ("if", "then", "else"):
            schema.pop(key, None)
        return [_any_of(branches)]

    def _dependencies(self, schema: dict, keyword: str) -> list[Any] | None:
        value = schema[keyword]
        if not isinstance(value, dict):
            return None
        added = []
        for name, dependants in value.items():
            if isinstance(dependants, list):
                if dependants:
                    added.append(_any_of([_lacks(name), {"required": [name, *dependants]}]))
            else:
                absent = {"anyOf": [{"type": _type_of(KINDS - {"object"})}, _lacks(name)]}
                added.append(_any_of([absent, _all_of([{"required": [name]}, dependants])]))
        del schema[keyword]
        return added

    def _not(self, schema: dict, _: str) -> list[Any] | None:
        negated = negate(schema["not"], _kinds_of(schema), self.root)
        if negated is None:
            return None
        del schema["not"]
        return [negated]

    def _one_of(self, schema: dict, _: str) -> list[Any] | None:
        branches = schema["oneOf"]
        if not isinstance(branches, list) or len(branches) > MAX_ONE_OF_BRANCHES:
            return None
        exclusive = []
        for i, branch in enumerate(branches):
            parts = [branch]
            within = _kinds_of(schema) & _kinds_of(branch)  # ¬other only where branch can be
            for j, other in enumerate(branches):
                if i == j:
                    continue
                separate = apart(branch, other, self.root) & within
                if separate == within:
                    continue
                # kinds proven apart are outside ``other`` already; negate it on the rest
                negated = negate(
                    other, within - separate, self.root, _closed_keys(branch, self.root)
                )
                separate_type = _type_of(separate) if separate else None
                if negated is None or (separate and separate_type is None):
                    return None
                parts.append(_any_of([{"type": separate_type} if separate else False, negated]))
            exclusive.append(_all_of(parts))
        del schema["oneOf"]
        return [_any_of(exclusive)]


def _asserting_nothing(schema: dict) -> list[str]:
    """Keywords of ``schema`` that no instance can fail, which backends may still refuse."""
    found = []
    if is_unknown_format(schema.get("format")):
        found.append("format")  # a format JSON Schema does not define
    if schema.get("uniqueItems") is False or (
        schema.get("uniqueItems") is True and _at_most(schema.get("maxItems"), 1)
    ):
        found.append("uniqueItems")  # false, or arrays of at most one item
    if (
        "propertyNames" in schema
        and negate(schema["propertyNames"], frozenset({"string"})) is False
    ):
        found.append("propertyNames")  # every key is a string it accepts
    return found


def _at_most(value: Any, bound: int) -> bool:
    return is_number(value) and value <= bound


def _conjoin(schema: dict, added: list[Any]) -> Any:
    """``schema`` and every one of ``added``: keywords merged where none collide (backends
    intersect ``allOf`` branches less well, and not at all beside recursive ``$ref``s),
    else appended to ``allOf``; never merged with a ``$ref`` (beside one, other keywords
    count only from draft 2019-09 on)."""
    rest = []
    for part in added:
        if part is False:
            return False  # nothing satisfies the node
        if part is True or part == {}:
            continue
        mergeable = isinstance(part, dict) and "$ref" not in part and "$ref" not in schema
        if mergeable and not set(part) & set(schema):
            schema.update(part)
        else:
            rest.append(part)
    if rest:
        schema["allOf"] = [*schema.get("allOf", []), *rest]
    return schema


@dataclass(frozen=True)
class _Within:
    """Where a negation is taken: the document ``$ref``s point into, the references being
    followed (a loop stops the negation), and the keys an object instance can have when
    the caller knows it is closed (``oneOf`` against a branch with
    ``additionalProperties: false``): then "a key outside ``properties``" can be written."""

    root: Any = None
    refs: tuple[str, ...] = ()
    keys: frozenset[str] | None = None

    def through(self, ref: str) -> _Within:
        return dataclasses.replace(self, refs=(*self.refs, ref))

    def inside(self) -> _Within:
        """For a property's or item's value: another instance, keys unknown."""
        return dataclasses.replace(self, keys=None)


def negate(
    schema: Any, kinds: frozenset[str] = KINDS, root: Any = None,
    keys: frozenset[str] | None = None,
) -> Any | None:  # fmt: skip
    """A schema accepting exactly the instances of ``kinds`` that ``schema`` rejects; ``None``
    when that cannot be written exactly (see the module docstring). ``root``: the document
    local ``$ref``s point into (a ``$ref`` is negated through its target, once per chain);
    ``keys``: the only keys an object instance can have, when known."""
    return _negate(schema, kinds, _Within(root, (), keys))


def _negate(schema: Any, kinds: frozenset[str], at: _Within) -> Any | None:
    if schema is True or schema == {}:
        return False
    if schema is False:
        every = _type_of(kinds)
        return None if every is None else {"type": every}
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        return _negate_ref(schema, kinds, at)
    disjuncts: list[Any] = []
    own = _kinds_of(schema) & kinds  # other keywords are negated within these kinds
    if own != kinds:  # instances of the other kinds fail ``type`` / ``enum`` / ``const``
        rest = _type_of(kinds - own)
        if rest is None:
            return None
        disjuncts.append({"type": rest})
    for keyword, value in schema.items():
        if keyword == "type" or keyword in ANNOTATIONS or keyword not in VALIDATION_KEYWORDS:
            continue
        if not own:
            break
        negated = _negate_keyword(keyword, value, schema, own, at)
        if negated is None:
            return None
        if negated is not False:
            disjuncts.append(negated)
    return _any_of(disjuncts) if disjuncts else False


def _negate_ref(schema: dict, kinds: frozenset[str], at: _Within) -> Any:
    """``¬{"$ref": R}`` is ``¬(what R points at)``; not beside other keywords (whether they
    count depends on the draft), not through ``$id`` (another base URI), not in a loop."""
    ref = schema["$ref"]
    others = [k for k in schema if k != "$ref" and k in VALIDATION_KEYWORDS]
    if at.root is None or others or not isinstance(ref, str) or ref in at.refs:
        return None
    target = resolve_pointer(at.root, ref) if ref.startswith("#") else None
    if target is None or (isinstance(target, dict) and ({"$id", "id"} & set(target))):
        return None
    return _negate(target, kinds, at.through(ref))


def _negate_keyword(
    keyword: str, value: Any, schema: dict, kinds: frozenset[str], at: _Within
) -> Any:
    """Instances of ``kinds`` that fail ``keyword`` (``False``: none), or ``None``."""
    if keyword in _BOUNDS:
        applies, opposite, step = _BOUNDS[keyword]
        if not kinds & applies:
            return False
        if not is_number(value) or not float(value).is_integer():
            return None
        bound = int(value) + step
        if bound < 0:
            return False  # minLength 0 and the like fail nothing
        return {"type": _type_of(applies), opposite: bound}
    if keyword in _NUMERIC_BOUNDS:
        if not kinds & _NUMBERS:
            return False
        if not is_number(value):
            return None  # draft 4's boolean exclusiveMinimum changes its sibling's meaning
        number_type = _type_of(kinds & _NUMBERS)
        return None if number_type is None else {
            "type": number_type, _NUMERIC_BOUNDS[keyword]: value
        }  # fmt: skip
    if keyword in ("enum", "const"):
        return _outside_values(value if keyword == "enum" else [value], kinds)
    if keyword == "required":
        if "object" not in kinds or not value:
            return False
        return {"type": "object", **_any_of_fields([_lacks(name) for name in value])}
    if keyword == "properties":
        if "object" not in kinds or not isinstance(value, dict):
            return False if "object" not in kinds else None
        failing = []
        for name, sub in value.items():
            negated = _negate(sub, KINDS, at.inside())
            if negated is None:
                return None
            if negated is not False:
                failing.append({"required": [name], "properties": {name: negated}})
        return {"type": "object", **_any_of_fields(failing)} if failing else False
    if keyword == "items" and not isinstance(value, list):
        if "array" not in kinds or value is True or value == {}:
            return False
        prefix = schema.get("prefixItems", [])  # 2020-12: "items" covers what follows them
        if value is False and isinstance(prefix, list):
            return {"type": "array", "minItems": len(prefix) + 1}
        return None
    if keyword == "additionalItems":
        items = schema.get("items")
        if "array" not in kinds or not isinstance(items, list) or value in (True, {}):
            return False
        return {"type": "array", "minItems": len(items) + 1} if value is False else None
    if keyword == "additionalProperties":
        return _negate_additional(value, schema, kinds, at)
    if keyword == "uniqueItems" and value is False:
        return False
    if keyword == "format" and is_unknown_format(value):
        return False  # asserts nothing
    if keyword == "anyOf" and isinstance(value, list):
        parts = [_negate(sub, kinds, at) for sub in value]
        return None if any(p is None for p in parts) else _all_of(parts)
    if keyword == "allOf" and isinstance(value, list):
        parts = [_negate(sub, kinds, at) for sub in value]
        if any(p is None for p in parts):
            return None
        kept = [p for p in parts if p is not False]
        return _any_of(kept) if kept else False
    if keyword == "not":
        return value  # ¬¬S = S
    return None


def _negate_additional(value: Any, schema: dict, kinds: frozenset[str], at: _Within) -> Any:
    """Objects with a key outside ``properties`` whose value fails ``value``: writable only
    when the keys an instance can have are known (``at.keys``), as one ``required`` each."""
    if "object" not in kinds or value is True or value == {}:
        return False
    named = schema.get("properties", {})
    if at.keys is None or schema.get("patternProperties") or not isinstance(named, dict):
        return None
    failing = _negate(value, KINDS, at.inside())  # the values an extra key may not have
    if failing is None:
        return None
    extra = sorted(at.keys - named.keys())
    shapes = [
        {"required": [key]} if value is False else {"required": [key], "properties": {key: failing}}
        for key in extra
    ]
    return {"type": "object", **_any_of_fields(shapes)} if shapes else False


def _outside_values(values: Any, kinds: frozenset[str]) -> Any | None:
    """Instances of ``kinds`` equal to none of ``values``."""
    if not isinstance(values, list):
        return None
    present = {json_type(v) for v in values}
    if kinds & {"array", "object"} & present:
        return None  # all arrays (objects) but these: no exact schema
    disjuncts: list[Any] = []
    if "string" in kinds and "string" in present:
        pattern = strings_other_than([v for v in values if isinstance(v, str)])
        if pattern is None:
            return None
        disjuncts.append({"type": "string", "pattern": pattern})
    whole = {k for k in kinds - _NUMBERS if k not in present}
    booleans = [v for v in values if isinstance(v, bool)]
    left = [b for b in (False, True) if b not in booleans]
    if "boolean" in kinds and booleans and left:
        disjuncts.append({"enum": left})
    numbers = sorted({v for v in values if is_number(v)})
    if kinds & _NUMBERS:
        number_type = _type_of(kinds & _NUMBERS)
        if number_type is None:
            return None
        if numbers:  # the open intervals between the excluded numbers
            gaps: list[dict] = [{"exclusiveMaximum": numbers[0]}]
            gaps += [
                {"exclusiveMinimum": low, "exclusiveMaximum": high}
                for low, high in itertools.pairwise(numbers)
            ]
            gaps.append({"exclusiveMinimum": numbers[-1]})
            disjuncts.append({"type": number_type, "anyOf": gaps})
        else:
            whole |= kinds & _NUMBERS
    if whole:
        disjuncts.insert(0, {"type": _type_of(frozenset(whole))})
    return _any_of(disjuncts) if disjuncts else False


def strings_other_than(excluded: list[str]) -> str | None:
    """An anchored ECMA-262 pattern matching every string but ``excluded``: a trie of them,
    leaving it at any character no excluded string continues with. ``None`` for characters
    outside the Basic Multilingual Plane (ECMA-262 patterns without ``u`` see two halves)."""
    if any(ord(ch) > 0xFFFF for text in excluded for ch in text):
        return None
    trie: dict = {}
    for text in excluded:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}  # the end of an excluded string

    def other_than(node: dict) -> str:
        nexts = sorted(k for k in node if k)
        alternatives = [] if "" in node else [""]  # stopping here is allowed
        if nexts:
            alternatives.append("[^" + "".join(_class_char(c) for c in nexts) + r"][\s\S]*")
        else:
            alternatives.append(r"[\s\S]+")
        alternatives += [_literal_char(c) + other_than(node[c]) for c in nexts]
        return "(?:" + "|".join(alternatives) + ")"

    return "^" + other_than(trie) + "$"


def _literal_char(ch: str) -> str:
    return "\\" + ch if ch in r"\^$.|?*+()[]{}" else _escaped_control(ch)


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in r"\^]-[" else _escaped_control(ch)


def _escaped_control(ch: str) -> str:
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def _only_keyword(schema: Any, keyword: str) -> bool:
    """``schema`` is an object whose one validation keyword is ``keyword``."""
    return (
        isinstance(schema, dict)
        and keyword in schema
        and not [k for k in schema if k != keyword and k in VALIDATION_KEYWORDS]
    )


def disjoint(a: Any, b: Any, root: Any = None) -> bool:
    """True when no instance can satisfy both schemas (sufficient tests only)."""
    return apart(a, b, root) == KINDS


def apart(a: Any, b: Any, root: Any = None) -> frozenset[str]:
    """The kinds of instance that cannot satisfy both schemas (sufficient tests only).

    A ``$ref`` is judged by its target alone (beside it, other keywords count only from
    draft 2019-09 on: the target's instances include the node's either way). Property
    tests (a required discriminator, a closed object) speak for objects only.
    """
    a, b = _target(a, root), _target(b, root)
    if a is False or b is False:
        return KINDS
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return frozenset()
    shared = _narrow_kinds(a, root) & _narrow_kinds(b, root)
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not any(same_json(x, y) for x in va for y in vb):
        return KINDS
    if "object" in shared and _objects_apart(a, b, root):
        shared -= {"object"}
    return KINDS - shared


def _objects_apart(a: dict, b: dict, root: Any) -> bool:
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    if not (isinstance(props_a, dict) and isinstance(props_b, dict)):
        return False
    required_a, required_b = _names(a.get("required")), _names(b.get("required"))
    for name in required_a & required_b & props_a.keys() & props_b.keys():
        if disjoint(props_a[name], props_b[name], root):
            return True
    return _closed_without(a, props_a, required_b) or _closed_without(b, props_b, required_a)


def _closed_keys(schema: Any, root: Any) -> frozenset[str] | None:
    """The only keys an object valid against ``schema`` can have, when it says so."""
    schema = _target(schema, root)
    if not isinstance(schema, dict):
        return None
    named = schema.get("properties", {})
    closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
    return frozenset(named) if closed and isinstance(named, dict) else None


def _closed_without(schema: dict, properties: dict, names: set[str]) -> bool:
    """``schema`` allows no other keys than ``properties``, and one of ``names`` is other."""
    closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
    return closed and bool(names - properties.keys())


def _names(value: Any) -> set[str]:
    return {n for n in value if isinstance(n, str)} if isinstance(value, list) else set()


def _target(schema: Any, root: Any, depth: int = 0) -> Any:
    """What a ``$ref`` node points at (followed up to 16 times), else the node itself."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 16:
        ref = schema["$ref"]
        target = resolve_pointer(root, ref) if root is not None and ref.startswith("#") else None
        if target is None or (isinstance(target, dict) and {"$id", "id"} & set(target)):
            return {}  # unknown: anything
        schema, depth = target, depth + 1
    return schema


def _narrow_kinds(schema: dict, root: Any) -> frozenset[str]:
    """``_kinds_of``, narrowed by every ``allOf`` branch (each holds of every instance)."""
    kinds = _kinds_of(schema)
    branches = schema.get("allOf")
    if isinstance(branches, list):
        for branch in branches:
            target = _target(branch, root)
            kinds &= _kinds_of(target) if isinstance(target, dict | bool) else KINDS
    return kinds


def _values(schema: dict) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def _kinds_of(schema: Any) -> frozenset[str]:
    """The kinds a schema's own ``type`` / ``const`` / ``enum`` allow (all, if silent)."""
    if not isinstance(schema, dict):
        return KINDS if schema is not False else frozenset()
    kinds = set(KINDS)
    value = schema.get("type")
    if value is not None:
        names = value if isinstance(value, list) else [value]
        kinds = set().union(*(_KINDS_OF_TYPE.get(n, set()) for n in names if isinstance(n, str)))
    values = _values(schema)
    if values is not None:
        of_values = set()
        for v in values:
            kind = json_type(v)
            # numbers as one kind: "1 or 2" has no exact complement within integers alone
            of_values |= _NUMBERS if kind in ("integer", "number") else {kind}
        kinds &= of_values
    return frozenset(kinds)


def _type_of(kinds: frozenset[str] | set[str]) -> Any | None:
    """A ``type`` value for exactly ``kinds``; ``None`` for non-integer numbers alone."""
    names = sorted(kinds - _NUMBERS)
    numbers = kinds & _NUMBERS
    if numbers == _NUMBERS:
        names.append("number")
    elif numbers == {"integer"}:
        names.append("integer")
    elif numbers:
        return None
    return names[0] if len(names) == 1 else names


def _lacks(name: str) -> dict:
    """Objects without property ``name`` (other instances fail)."""
    return {"type": "object", "properties": {name: False}}


def _any_of_fields(parts: list[Any]) -> dict:
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _any_of(parts: list[Any]) -> Any:
    parts = [q for p in parts for q in (_only(p, "anyOf") or [p]) if q is not False]
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _all_of(parts: list[Any]) -> Any:
    parts = [q for p in parts for q in (_only(p, "allOf") or [p]) if q is not True and q != {}]
    if any(p is False for p in parts):
        return False
    if not parts:
        return True
    return parts[0] if len(parts) == 1 else {"allOf": parts}


def _only(schema: Any, keyword: str) -> list[Any] | None:
    """The list of a schema that is nothing but ``{keyword: [...]}``."""
    if isinstance(schema, dict) and list(schema) == [keyword] and isinstance(schema[keyword], list):
        return schema[keyword]
    return None


def _uses_unevaluated(schema: Any) -> bool:
    text = json.dumps(schema)
    return '"unevaluatedProperties"' in text or '"unevaluatedItems"' in text


def _local_refs(schema: Any) -> set[str]:
    refs: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.add(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return refs
