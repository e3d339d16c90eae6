"""Negation and disjointness of JSON schemas, exactly: the algebra ``schema_rewrite`` uses.

``negate(S, kinds)`` is a schema accepting exactly the instances of ``kinds`` that ``S``
rejects, or ``None`` when no schema of the keywords backends enforce says that:
``¬(k1 ∧ k2 ∧ ...) = ¬k1 ∨ ¬k2 ∨ ...`` over ``S``'s keywords, each keyword negated only over
the kinds it applies to (``minLength: 3`` fails only strings: ``¬`` is strings of length 2
or less); ``¬{enum: [...]}`` writes the strings other than the excluded ones as a pattern
(``strings_other_than``); ``anyOf``/``allOf`` by De Morgan, ``¬¬S = S``, a ``$ref`` through
its target. ``None`` for ``pattern``, ``multipleOf``, ``uniqueItems``, ``patternProperties``,
a known ``format``, an array or object ``enum``, ``not {type: integer}`` over all numbers...

``apart(A, B)`` is the kinds of instance no schema can satisfy both of (sufficient tests:
types, ``const``/``enum``, and for objects a required discriminator or a closed object
lacking a key the other requires); ``disjoint`` when that is every kind.

Kinds are JSON Schema's types with numbers split in two (``integer``, ``fraction``), so that
``integer`` has a complement; a kind set with ``fraction`` but not ``integer`` has no
``type``, and what would need one is ``None``.

Example::

    >>> negate({"required": ["a"]})
    {'type': 'object', 'properties': {'a': False}}
    >>> negate({"minLength": 3}, frozenset({"string", "null"}))
    {'type': 'string', 'maxLength': 2}
    >>> sorted(apart({"type": "string"}, {"minimum": 1}))  # a string satisfies both
    ['array', 'boolean', 'fraction', 'integer', 'null', 'object']
    >>> disjoint({"type": "string"}, {"type": "integer", "minimum": 1})
    True
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

from constrained.schema.walk import (
    ANNOTATIONS,
    VALIDATION_KEYWORDS,
    is_number,
    is_unknown_format,
    json_type,
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


@dataclass(frozen=True)
class _Within:
    """Where a negation is taken: the document ``$ref``s point into, the references being
    followed (a loop stops the negation), the keys an object instance can have when
    the caller knows it is closed (``oneOf`` against a branch with
    ``additionalProperties: false``): then "a key outside ``properties``" can be written,
    and ``given``: schemas every instance is known to satisfy (the other ``oneOf``
    branch), whose keywords the negation may skip where the negated schema repeats them."""

    root: Any = None
    refs: tuple[str, ...] = ()
    keys: frozenset[str] | None = None
    given: tuple[dict, ...] = ()

    def through(self, ref: str) -> _Within:
        return dataclasses.replace(self, refs=(*self.refs, ref))

    def inside(self, given: tuple[dict, ...] = ()) -> _Within:
        """For a property's or item's value: another instance, keys unknown, known to
        satisfy ``given``."""
        return dataclasses.replace(self, keys=None, given=given)


def negate(
    schema: Any, kinds: frozenset[str] = KINDS, root: Any = None,
    keys: frozenset[str] | None = None, given: Any = True,
) -> Any | None:  # fmt: skip
    """A schema whose instances of ``kinds`` are exactly those ``schema`` rejects (outside
    ``kinds`` it may say anything: every caller intersects it with schemas of those kinds);
    ``None`` when that cannot be written exactly (see the module docstring). ``root``: the document
    local ``$ref``s point into (a ``$ref`` is negated through its target, once per chain);
    ``keys``: the only keys an object instance can have, when known; ``given``: a schema
    every instance satisfies (the caller intersects the negation with it): only the
    instances of ``given`` are then exact, and a keyword ``given`` asserts too (the same
    value, with the keywords its meaning depends on) is not negated, as none of them fails
    it (``¬S`` of a ``oneOf`` branch beside one sharing most of ``S``)."""
    return _negate(schema, kinds, _Within(root, (), keys, _given(given, root)))


def _given(schema: Any, root: Any) -> tuple[dict, ...]:
    """The objects of ``_conjuncts``: schemas every instance of ``schema`` satisfies."""
    return tuple(c for c in _conjuncts(schema, root) if isinstance(c, dict))


# What a keyword means depends on these siblings too: two schemas assert the same with it
# only when they agree on all of them.
_DEPENDS_ON = {
    "additionalProperties": ("properties", "patternProperties"),
    "items": ("prefixItems",),
    "additionalItems": ("items",),
    "maximum": ("exclusiveMaximum",),
    "minimum": ("exclusiveMinimum",),
    "exclusiveMaximum": ("maximum",),
    "exclusiveMinimum": ("minimum",),
    "contains": ("minContains", "maxContains"),
    "minContains": ("contains", "maxContains"),
    "maxContains": ("contains", "minContains"),
    "if": ("then", "else"),
    "then": ("if", "else"),
    "else": ("if", "then"),
}
# Keywords whose meaning depends on other subschemas or on the base URI: never compared.
_NOT_COMPARED = frozenset(
    {"$ref", "$dynamicRef", "$recursiveRef", "unevaluatedProperties", "unevaluatedItems"}
)


def _implied(keyword: str, schema: dict, given: tuple[dict, ...]) -> bool:
    """Every instance of ``given`` satisfies ``keyword`` of ``schema``: one of them has the
    same keyword with the same value, and the same siblings that keyword depends on."""
    if keyword in _NOT_COMPARED or not given:
        return False
    names = (keyword, *_DEPENDS_ON.get(keyword, ()))
    return any(
        all((n in g) == (n in schema) and (n not in g or same_json(g[n], schema[n])) for n in names)
        for g in given
    )


def _negate(schema: Any, kinds: frozenset[str], at: _Within) -> Any | None:
    if schema is True or schema == {}:
        return False
    if schema is False:
        every = type_of(kinds)
        return None if every is None else {"type": every}
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        return _negate_ref(schema, kinds, at)
    for known in at.given:
        kinds &= kinds_of(known)  # instances of other kinds are outside ``given``
    disjuncts: list[Any] = []
    own = kinds_of(schema) & kinds  # other keywords are negated within these kinds
    if own != kinds:  # instances of the other kinds fail ``type`` / ``enum`` / ``const``
        rest = type_of(kinds - own)
        if rest is None:
            return None
        disjuncts.append({"type": rest})
    for keyword, value in schema.items():
        if keyword == "type" or keyword in ANNOTATIONS or keyword not in VALIDATION_KEYWORDS:
            continue
        if not own:
            break
        if _implied(keyword, schema, at.given):
            continue  # no instance of ``given`` fails it
        negated = _negate_keyword(keyword, value, schema, own, at)
        if negated is None:
            return None
        if negated is not False:
            disjuncts.append(negated)
    return any_of(disjuncts) if disjuncts else False


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
    if keyword in _BOUNDS or keyword in _NUMERIC_BOUNDS:
        return _negate_bound(keyword, value, kinds)
    if keyword in ("enum", "const"):
        return _outside_values(value if keyword == "enum" else [value], kinds)
    if keyword == "required":
        if "object" not in kinds or not value:
            return False
        return {"type": "object", **_any_of_fields([lacks(name) for name in value])}
    if keyword == "properties":
        return _negate_properties(value, kinds, at)
    if keyword == "additionalItems" or (keyword == "items" and not isinstance(value, list)):
        return _negate_item_rule(keyword, value, schema, kinds, at)
    if keyword == "additionalProperties":
        return _negate_additional(value, schema, kinds, at)
    if keyword == "uniqueItems" and value is False:
        return False
    if keyword == "format" and is_unknown_format(value):
        return False  # asserts nothing
    if keyword in ("anyOf", "allOf") and isinstance(value, list):
        parts = [_negate(sub, kinds, at) for sub in value]
        if any(p is None for p in parts):
            return None
        if keyword == "anyOf":
            return all_of(parts)
        kept = [p for p in parts if p is not False]
        return any_of(kept) if kept else False
    if keyword == "not":
        return value  # ¬¬S = S
    return None


def _negate_bound(keyword: str, value: Any, kinds: frozenset[str]) -> Any:
    """``¬`` of a length, count or numeric bound, over the kinds it applies to."""
    if keyword in _BOUNDS:
        applies, opposite, step = _BOUNDS[keyword]
        if not kinds & applies:
            return False
        if not is_number(value) or not float(value).is_integer():
            return None
        bound = int(value) + step
        if bound < 0:
            return False  # minLength 0 and the like fail nothing
        return {"type": type_of(applies), opposite: bound}
    if not kinds & _NUMBERS:
        return False
    if not is_number(value):
        return None  # draft 4's boolean exclusiveMinimum changes its sibling's meaning
    number_type = type_of(kinds & _NUMBERS)
    return None if number_type is None else {
        "type": number_type, _NUMERIC_BOUNDS[keyword]: value
    }  # fmt: skip


def _negate_properties(value: Any, kinds: frozenset[str], at: _Within) -> Any:
    """Objects with a listed property whose value fails its subschema."""
    if "object" not in kinds or not isinstance(value, dict):
        return False if "object" not in kinds else None
    failing = []
    for name, sub in value.items():
        if at.keys is not None and name not in at.keys:
            continue  # the instance cannot have this key
        negated = _negate(sub, KINDS, at.inside(_property_given(at.given, name, at.root)))
        if negated is None:
            return None
        if negated is not False:
            failing.append({"required": [name], "properties": {name: negated}})
    return {"type": "object", **_any_of_fields(failing)} if failing else False


def _negate_item_rule(
    keyword: str, value: Any, schema: dict, kinds: frozenset[str], at: _Within
) -> Any:
    """Arrays with an item failing ``items`` (a schema, after any ``prefixItems``) or
    ``additionalItems`` (after a list-valued ``items``)."""
    if keyword == "additionalItems":
        items = schema.get("items")
        if "array" not in kinds or not isinstance(items, list) or value in (True, {}):
            return False
        return {"type": "array", "minItems": len(items) + 1} if value is False else None
    if "array" not in kinds or value is True or value == {}:
        return False
    prefix = schema.get("prefixItems", [])  # 2020-12: "items" covers what follows them
    if value is False and isinstance(prefix, list):
        return {"type": "array", "minItems": len(prefix) + 1}
    return None if "prefixItems" in schema else _negate_items(value, at)


def _negate_items(value: Any, at: _Within) -> Any | None:
    """Arrays with an item failing ``value``, among those of ``given`` (whose every item
    satisfies the ``items`` of ``given``): none when those imply ``value``, every non-empty
    one when they exclude it; else ``None`` (no keyword says "some item fails")."""
    items = tuple(
        schema["items"]
        for schema in at.given
        if "items" in schema and not isinstance(schema["items"], list)
        and "prefixItems" not in schema
    )  # fmt: skip
    if not items:
        return None
    if _negate(value, KINDS, at.inside(_given({"allOf": list(items)}, at.root))) is False:
        return False
    if any(apart(value, item, at.root) == KINDS for item in items):
        return {"type": "array", "minItems": 1}
    return None


def _property_given(given: tuple[dict, ...], name: str, root: Any) -> tuple[dict, ...]:
    """What ``given`` says of property ``name``'s value, when the instance has it."""
    found: tuple[dict, ...] = ()
    for schema in given:
        named = schema.get("properties")
        if isinstance(named, dict) and name in named:
            found += _given(named[name], root)
    return found


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
        number_type = type_of(kinds & _NUMBERS)
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
        disjuncts.insert(0, {"type": type_of(frozenset(whole))})
    return any_of(disjuncts) if disjuncts else False


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


def literal(text: str) -> str:
    """``text`` as an ECMA-262 pattern matching it literally."""
    return "".join(_literal_char(ch) for ch in text)


def _literal_char(ch: str) -> str:
    return "\\" + ch if ch in r"\^$.|?*+()[]{}" else _escaped_control(ch)


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in r"\^]-[" else _escaped_control(ch)


def _escaped_control(ch: str) -> str:
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def disjoint(a: Any, b: Any, root: Any = None) -> bool:
    """True when no instance can satisfy both schemas (sufficient tests only)."""
    return apart(a, b, root) == KINDS


def apart(a: Any, b: Any, root: Any = None, _depth: int = 0) -> frozenset[str]:
    """The kinds of instance that cannot satisfy both schemas (sufficient tests only).

    Each schema is read as the conjunction of itself and its ``allOf`` branches; a ``$ref``
    is judged by its target alone (beside it, other keywords count only from draft 2019-09
    on: the target's instances include the node's either way). Property tests (a required
    discriminator, a closed object) speak for objects only.
    """
    if _depth > _MAX_PROOF_DEPTH:
        return frozenset()
    conj_a, conj_b = _conjuncts(a, root), _conjuncts(b, root)
    if False in conj_a or False in conj_b:
        return KINDS
    shared = KINDS
    for part in (*conj_a, *conj_b):
        shared &= kinds_of(part)
    values_a = [v for v in map(_values, conj_a) if v is not None]
    values_b = [v for v in map(_values, conj_b) if v is not None]
    for va, vb in itertools.product(values_a, values_b):
        if not any(same_json(x, y) for x in va for y in vb):
            return KINDS
    if "object" in shared and _objects_apart(conj_a, conj_b, root, _depth):
        shared -= {"object"}
    if "string" in shared and _strings_apart(conj_a, conj_b):
        shared -= {"string"}
    return KINDS - shared


def _strings_apart(conj_a: list[dict], conj_b: list[dict]) -> bool:
    """A ``pattern`` of each side, anchored at the start, whose possible first characters
    share none (and neither matches the empty string: every string it matches has one)."""
    firsts_a = [_first_chars(c.get("pattern")) for c in conj_a if "pattern" in c]
    firsts_b = [_first_chars(c.get("pattern")) for c in conj_b if "pattern" in c]
    return any(
        a is not None and b is not None and _disjoint_chars(a, b)
        for a, b in itertools.product(firsts_a, firsts_b)
    )


# A set of characters: (False, chars) is ``chars``; (True, chars) every character but them.
_Chars = tuple[bool, frozenset[str]]
_CLASS_ESCAPES = {
    "d": frozenset("0123456789"),
    "w": frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"),
}
_SPECIAL = frozenset("\\^$.|?*+()[]{}")


def _first_chars(pattern: Any) -> _Chars | None:
    """The characters a string matching ECMA-262 ``pattern`` can start with, for a pattern
    anchored by a leading ``^`` whose rest never matches the empty string; ``None`` when
    unknown (other syntax: lookarounds, backreferences, ``\\s``...)."""
    if not isinstance(pattern, str) or not pattern.startswith("^"):
        return None
    if any(ord(ch) > 0xFFFF for ch in pattern):
        return None  # two UTF-16 units to ECMA-262, one character to a JSON string
    try:
        parser = _FirstChars(pattern, 1)
        first, nullable = parser.sequence()
    except (ValueError, IndexError):
        return None
    if parser.at != len(pattern) or nullable:
        return None  # a top-level "|" (its other side is not anchored), or "" matches
    return first


class _FirstChars:
    """A recursive-descent reading of a small ECMA-262 subset: for each part, the
    characters it can start with and whether it can match the empty string."""

    def __init__(self, pattern: str, at: int) -> None:
        self.pattern, self.at = pattern, at

    def peek(self) -> str:
        return self.pattern[self.at] if self.at < len(self.pattern) else ""

    def sequence(self) -> tuple[_Chars, bool]:
        first: _Chars = (False, frozenset())
        nullable = True
        while self.peek() not in ("", "|", ")"):
            atom, atom_nullable = self.quantified()
            if nullable:
                first = _union_chars(first, atom)
            nullable = nullable and atom_nullable
        return first, nullable

    def alternation(self) -> tuple[_Chars, bool]:
        first, nullable = self.sequence()
        while self.peek() == "|":
            self.at += 1
            more, more_nullable = self.sequence()
            first, nullable = _union_chars(first, more), nullable or more_nullable
        return first, nullable

    def quantified(self) -> tuple[_Chars, bool]:
        first, nullable = self.atom()
        char = self.peek()
        if char in ("?", "*"):
            self.at += 1
            nullable = True
        elif char == "+":
            self.at += 1
        elif char == "{":
            end = self.pattern.index("}", self.at)
            low = self.pattern[self.at + 1 : end].split(",")[0]
            if not low.isdigit():
                raise ValueError(self.pattern)
            self.at = end + 1
            nullable = nullable or int(low) == 0
        if char in ("?", "*", "+", "{") and self.peek() == "?":
            self.at += 1  # lazy: the same strings
        return first, nullable

    def atom(self) -> tuple[_Chars, bool]:
        char = self.peek()
        self.at += 1
        if char == "(":
            if self.peek() == "?":
                if self.pattern[self.at : self.at + 2] != "?:":
                    raise ValueError(self.pattern)  # a lookaround or a named group
                self.at += 2
            found = self.alternation()
            if self.peek() != ")":
                raise ValueError(self.pattern)
            self.at += 1
            return found
        if char == "[":
            return self.character_class(), False
        if char == "\\":
            return self.escape(), False
        if char == "$":
            return (False, frozenset()), True  # matches "" (at the end only)
        if char == ".":
            return (True, frozenset("\n\r\u2028\u2029")), False  # not a line terminator
        if char in _SPECIAL:
            raise ValueError(self.pattern)  # "^" inside, a quantifier with nothing before...
        return (False, frozenset(char)), False

    def escape(self) -> _Chars:
        char = self.peek()
        self.at += 1
        if char in _CLASS_ESCAPES:
            return False, _CLASS_ESCAPES[char]
        if char.isalnum() or not char:
            raise ValueError(self.pattern)  # \\s, \\b, \\u..., backreferences
        return False, frozenset(char)

    def character_class(self) -> _Chars:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        if self.peek() == "]":
            raise ValueError(self.pattern)  # "[]" / "[^]"
        chars: set[str] = set()
        while self.peek() != "]":
            low = self.class_char()
            if isinstance(low, str) and self.peek() == "-" and self.pattern[self.at + 1] != "]":
                self.at += 1
                high = self.class_char()
                if not isinstance(high, str) or ord(high) < ord(low):
                    raise ValueError(self.pattern)
                chars.update(chr(c) for c in range(ord(low), ord(high) + 1))
            elif isinstance(low, str):
                chars.add(low)
            else:
                chars.update(low)
        self.at += 1
        return negated, frozenset(chars)

    def class_char(self) -> str | frozenset[str]:
        char = self.peek()
        if not char:
            raise ValueError(self.pattern)
        self.at += 1
        if char != "\\":
            return char
        escaped = self.peek()
        self.at += 1
        if escaped in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[escaped]
        if escaped.isalnum() or not escaped:
            raise ValueError(self.pattern)
        return escaped


def _union_chars(a: _Chars, b: _Chars) -> _Chars:
    (neg_a, set_a), (neg_b, set_b) = a, b
    if not neg_a and not neg_b:
        return False, set_a | set_b
    if neg_a and neg_b:
        return True, set_a & set_b
    return (True, set_a - set_b) if neg_a else (True, set_b - set_a)


def _disjoint_chars(a: _Chars, b: _Chars) -> bool:
    (neg_a, set_a), (neg_b, set_b) = a, b
    if neg_a and neg_b:
        return False
    if not neg_a and not neg_b:
        return not set_a & set_b
    return set_b <= set_a if neg_a else set_a <= set_b


_MAX_PROOF_DEPTH = 6  # nested discriminators followed; recursive schemas stop here


def conjuncts(schema: Any, root: Any = None) -> list[Any]:
    """``schema`` (through ``$ref``s into ``root``) and, recursively, its ``allOf``
    branches: every instance satisfies each. ``False`` among them when one accepts nothing."""
    return _conjuncts(schema, root)


def _conjuncts(schema: Any, root: Any, depth: int = 0) -> list[Any]:
    """``schema`` (through ``$ref``s) and, recursively, its ``allOf`` branches: every
    instance satisfies each. ``False`` among them when one accepts nothing."""
    schema = _target(schema, root)
    if schema is False:
        return [False]
    if not isinstance(schema, dict):
        return []
    found = [schema]
    branches = schema.get("allOf")
    if isinstance(branches, list) and depth < _MAX_PROOF_DEPTH:
        for branch in branches:
            found += _conjuncts(branch, root, depth + 1)
    return found


def _objects_apart(conj_a: list[dict], conj_b: list[dict], root: Any, depth: int) -> bool:
    """No object satisfies both: a property both require with disjoint schemas, or a closed
    object lacking a key the other requires."""
    required_a = set().union(*(_names(c.get("required")) for c in conj_a))
    required_b = set().union(*(_names(c.get("required")) for c in conj_b))
    for name in sorted(required_a & required_b):
        for sa, sb in itertools.product(_property(conj_a, name), _property(conj_b, name)):
            if apart(sa, sb, root, depth + 1) == KINDS:
                return True
    return any(_closed_without(c, required_b) for c in conj_a) or any(
        _closed_without(c, required_a) for c in conj_b
    )


def _property(conjuncts: list[dict], name: str) -> list[Any]:
    """Every schema the conjuncts give property ``name``."""
    found = []
    for part in conjuncts:
        named = part.get("properties")
        if isinstance(named, dict) and name in named:
            found.append(named[name])
    return found


def closed_keys(schema: Any, root: Any) -> frozenset[str] | None:
    """The only keys an object valid against ``schema`` can have, when it says so."""
    schema = _target(schema, root)
    if not isinstance(schema, dict):
        return None
    named = schema.get("properties", {})
    closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
    return frozenset(named) if closed and isinstance(named, dict) else None


def _closed_without(schema: dict, names: set[str]) -> bool:
    """``schema`` allows no other keys than its ``properties``, and one of ``names`` is other."""
    keys = closed_keys(schema, None)
    return keys is not None and bool(names - keys)


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


def values_of(schema: dict) -> list[Any] | None:
    """The values a schema's own ``const`` / ``enum`` allow, if it has one."""
    return _values(schema)


def _values(schema: dict) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def kinds_of(schema: Any) -> frozenset[str]:
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


def type_of(kinds: frozenset[str] | set[str]) -> Any | None:
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


def lacks(name: str) -> dict:
    """Objects without property ``name`` (other instances fail)."""
    return {"type": "object", "properties": {name: False}}


def _any_of_fields(parts: list[Any]) -> dict:
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def any_of(parts: list[Any]) -> Any:
    parts = [q for p in parts for q in (_only(p, "anyOf") or [p]) if q is not False]
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def all_of(parts: list[Any]) -> Any:
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
