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

``negate`` and ``apart`` are in ``schema_negation``; where ``negate`` has no exact answer
(``None``), the keyword stays.

Example::

    >>> rewrite_schema({"type": "string", "not": {"maxLength": 2}})
    {'type': 'string', 'allOf': [{'type': 'string', 'minLength': 3}]}
    >>> rewrite_schema({"dependentRequired": {"a": ["b"]}})["anyOf"][1]
    {'required': ['a', 'b']}
"""

from __future__ import annotations

import bisect
import copy
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from jsonschema import validators

from constrained.errors import GrammarError
from constrained.schema.finite_values import (
    DRAFTS,
    finite_candidates,
    judged_exactly,
    same_regex,
    valid_values,
)
from constrained.schema.negation import (
    KINDS,
    all_of,
    any_of,
    apart,
    closed_keys,
    kinds_of,
    lacks,
    literal,
    negate,
    type_of,
    values_of,
)
from constrained.schema.walk import (
    ANNOTATIONS,
    VALIDATION_KEYWORDS,
    escape_pointer,
    is_int,
    is_number,
    is_unknown_format,
    local_refs_at,
    map_subschemas,
    nested_resources,
    resolve_pointer,
)

T = TypeVar("T")
MAX_ONE_OF_BRANCHES = 8  # oneOf by negation costs n² negations


@functools.lru_cache(maxsize=256)
def rewrite_schema_text(text: str) -> str:
    """``rewrite_schema`` over JSON text; the same text when nothing was rewritten. Cached:
    ``auto`` asks once per backend it tries."""
    schema = json.loads(text)
    rewritten = rewrite_schema(schema)
    return text if rewritten == schema else json.dumps(rewritten, ensure_ascii=False)


def first_enforced(text: str, attempt: Callable[[str], T]) -> T:
    """``attempt(text)``; when it raises ``GrammarError`` (a backend refuses the schema as
    written), ``attempt`` of the rewritten schema once. Its refusal names the keyword as
    written, so when the rewritten schema fails too, the first error is raised."""
    try:
        return attempt(text)
    except GrammarError as refused:
        rewritten = rewrite_schema_text(text)
        if rewritten == text:
            raise
        try:
            return attempt(rewritten)
        except GrammarError:
            raise refused from None


def rewrite_schema(schema: Any) -> Any:
    """A copy of ``schema`` with every keyword the rules above express rewritten.

    A schema using ``unevaluatedProperties`` / ``unevaluatedItems`` is returned as it is:
    what they allow depends on which subschemas evaluated a property, which rewriting
    ``if`` or ``oneOf`` into ``anyOf`` would change.
    """
    if _uses_unevaluated(schema):
        return schema
    original = schema
    schema = in_its_draft(copy.deepcopy(schema))
    if schema is None:
        return original
    return _Rewriter(schema, original).node(schema, "#")


def in_its_draft(schema: Any) -> Any | None:
    """``schema`` without the keywords later drafts than its declared ``$schema`` introduced.

    Those assert nothing in that draft (``const`` in draft 4, ``if`` in draft 6,
    ``dependentRequired`` in draft 7), and a negation must not give them meaning: ``not
    {const: 1}`` rejects every instance in draft 4, where "anything but 1" would let 2
    through. Keywords a later draft dropped (``dependencies`` in 2019-09 on) stay: the
    suite's ``optional/dependencies-compatibility`` expects them enforced; but where the
    schema negates (``not``, ``if``, ``oneOf``), enforced would be looser than ignored, so
    such a schema is not rewritten. Without ``$schema`` every keyword counts, whichever
    draft defined it (as the rules do). ``None`` (rewrite nothing) for draft 3, whose
    keywords mean other things, when a ``$ref`` points into a keyword to drop, or for a
    dropped keyword beside a negation.
    """
    if not isinstance(schema, dict) or not isinstance(schema.get("$schema"), str):
        return schema
    draft = validators.validator_for(schema, default=None)
    if draft is None:
        return schema
    if draft is validators.Draft3Validator:
        return None
    undefined, removed = _introduced_after(draft), _removed_by(draft)
    targets = [target for _, target in local_refs_at(schema)]
    found: set[str] = set()

    def strip(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            found.update(node.keys() & (removed | _NEGATING))
            for keyword in undefined & node.keys():
                at = f"{path}/{escape_pointer(keyword)}"
                if any(t == at or t.startswith(at + "/") for t in targets):
                    raise LookupError(at)
                del node[keyword]
            map_subschemas(node, path, strip)
        return node

    try:
        stripped = strip(schema, "#")
    except LookupError:
        return None
    return None if found & removed and found & _NEGATING else stripped


class _Rewriter:
    def __init__(self, root: Any, original: Any) -> None:
        self.root = root  # rewritten in place, bottom-up
        self.original = original  # as written: what ``_finite`` judges values by
        # (target, where the $ref is), sorted: those into one subschema are adjacent
        self.refs = sorted((ref, where) for where, ref in local_refs_at(original))
        # Keywords are compared across subschemas (``negate``'s ``given``) only where every
        # ``$ref`` in them resolves against the same base URI: no nested ``$id``.
        self.one_resource = next(nested_resources(root), None) is None

    def given(self, *schemas: Any) -> Any:
        """What every instance a negation is intersected with satisfies (``negate``)."""
        return all_of(list(schemas)) if self.one_resource else True

    def node(self, schema: Any, path: str) -> Any:
        if not isinstance(schema, dict):
            return schema
        added: list[Any] = []
        inner = schema.get("not")
        if _only_keyword(inner, "not") and not self._pointed_into(path, "not"):
            added.append(self.node(schema.pop("not")["not"], f"{path}/not/not"))  # ¬¬S = S
        map_subschemas(schema, path, self.node)  # bottom-up: children first
        values = self._finite(path)
        if values is not None:
            return {k: v for k, v in schema.items() if k in _KEPT_BESIDE_ENUM} | {"enum": values}
        for keywords, rule in (
            (("if", "then", "else"), self._if_then_else),
            (("dependencies",), self._dependencies),
            (("dependentRequired",), self._dependencies),
            (("dependentSchemas",), self._dependencies),
            (("not",), self._not),
            (("oneOf",), self._one_of),
            (("propertyNames",), self._property_names),
        ):
            if keywords[0] in schema and not any(self._pointed_into(path, k) for k in keywords):
                done = rule(schema, keywords[0], path)
                if done is not None:
                    added.extend(done)
        written = FORMAT_PATTERNS.get(schema.get("format"))  # type: ignore[arg-type]
        if written is not None and not self._pointed_into(path, "format"):
            del schema["format"]
            added.append({"pattern": written})
        for keyword in _asserting_nothing(schema):
            if not self._pointed_into(path, keyword):
                del schema[keyword]
        if "if" not in schema and not any(self._pointed_into(path, k) for k in ("then", "else")):
            schema.pop("then", None), schema.pop("else", None)  # no effect without "if"
        return _conjoin(schema, added)

    def _finite(self, path: str) -> list[Any] | None:
        """The values the node at ``path`` accepts, when an ``enum`` or ``const`` among its
        conjuncts bounds them and every other keyword can be judged here exactly: each of
        those values checked by ``jsonschema`` against the node as written (with the
        draft of ``$schema``; without one, every draft must agree). ``None`` otherwise."""
        node = resolve_pointer(self.original, path) if self.one_resource else None
        if not isinstance(node, dict) or not set(node) - _PLAIN_BESIDE_ENUM:
            return None  # nothing but the enum, its type and annotations: nothing to judge
        candidates = finite_candidates(node, self.original)
        if candidates is None:
            return None
        dropped = [f"{path}/{escape_pointer(k)}" for k in node if k not in _KEPT_BESIDE_ENUM]
        if any(
            not _within(source, dropped) for prefix in dropped for source in self._refs_into(prefix)
        ):
            return None  # a $ref from outside points into what the enum replaces
        if not judged_exactly(node, self.original, candidates):
            return None
        return valid_values(node, self.original, candidates)

    def _failing(self, given: Any, path: str) -> Any | None:
        """The instances of ``given`` that the subschema at ``path`` (as written) rejects,
        when ``given`` bounds them to the values of an ``enum`` or ``const`` and each can be
        judged exactly (``_finite``): ``{"enum": those failing}``; ``None`` otherwise."""
        schema = resolve_pointer(self.original, path) if self.one_resource else None
        candidates = finite_candidates(given, self.root)
        if schema is None or candidates is None:
            return None
        if not judged_exactly(schema, self.original, candidates):
            return None
        valid = valid_values(schema, self.original, candidates)
        if valid is None:
            return None
        failing = [v for v in candidates if not any(v is w for w in valid)]
        return {"enum": failing} if failing else False

    def _pointed_into(self, path: str, keyword: str) -> bool:
        return next(self._refs_into(f"{path}/{escape_pointer(keyword)}"), None) is not None

    def _refs_into(self, prefix: str) -> Iterator[str]:
        """Where each ``$ref`` pointing at ``prefix`` or inside it is."""
        at = bisect.bisect_left(self.refs, (prefix, ""))
        while at < len(self.refs):
            target, where = self.refs[at]
            if not target.startswith(prefix):
                return
            if target == prefix or target.startswith(prefix + "/"):
                yield where
            at += 1

    def _if_then_else(self, schema: dict, _: str, __: str) -> list[Any] | None:
        condition = schema["if"]
        if "then" not in schema and "else" not in schema:
            del schema["if"]  # asserts nothing alone
            return []
        given = self.given(_without(schema, ("if", "then", "else")))
        negated = negate(condition, kinds_of(schema), self.root, given=given)
        if negated is None:
            return None
        branches = [
            all_of([condition, schema.get("then", True)]),
            all_of([negated, schema.get("else", True)]),
        ]
        for key in ("if", "then", "else"):
            schema.pop(key, None)
        return [any_of(branches)]

    def _dependencies(self, schema: dict, keyword: str, _: str) -> list[Any] | None:
        value = schema[keyword]
        if not isinstance(value, dict):
            return None
        added = []
        for name, dependants in value.items():
            if isinstance(dependants, list):
                if dependants:
                    added.append(any_of([lacks(name), {"required": [name, *dependants]}]))
            else:
                absent = {"anyOf": [{"type": type_of(KINDS - {"object"})}, lacks(name)]}
                added.append(any_of([absent, all_of([{"required": [name]}, dependants])]))
        del schema[keyword]
        return added

    def _not(self, schema: dict, _: str, __: str) -> list[Any] | None:
        given = self.given(_without(schema, ("not",)))
        negated = negate(schema["not"], kinds_of(schema), self.root, given=given)
        if negated is None:
            return None
        del schema["not"]
        return [negated]

    def _property_names(self, schema: dict, keyword: str, _: str) -> list[Any] | None:
        """``propertyNames: P`` where P is one regex over keys (a ``pattern``, string
        ``const`` / ``enum``, lengths; ``false``: no key): every key matches it, so the keys
        not listed match ``patternProperties: {R: additional}`` and nothing else is allowed;
        a listed key P refuses becomes ``false``. Only where no ``patternProperties`` is
        there and ``additionalProperties`` applies to unlisted keys alone (absent, ``true``,
        or no ``properties``), each listed key judged exactly; ``None`` otherwise."""
        names = schema[keyword]
        if names is False:
            del schema[keyword]
            return [{"maxProperties": 0}]  # no key at all (objects only)
        regex = _key_regex(names)
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties", True)
        if regex is None or "patternProperties" in schema or not isinstance(properties, dict):
            return None
        if properties and additional not in (True, {}):
            return None  # additional would now also apply to listed keys matching it
        pattern = names.get("pattern")
        if pattern is not None and not same_regex(pattern, list(properties)):
            return None  # Python and ECMA-262 might judge a listed key differently
        check = validators.Draft202012Validator(names)
        del schema[keyword]
        for name in [n for n in properties if not check.is_valid(n)]:
            properties[name] = False
        schema["patternProperties"] = {regex: additional}
        schema["additionalProperties"] = False
        return []

    def _one_of(self, schema: dict, _: str, path: str) -> list[Any] | None:
        branches = schema["oneOf"]
        if not isinstance(branches, list) or len(branches) > MAX_ONE_OF_BRANCHES:
            return None
        exclusive = []
        rest = _without(schema, ("oneOf",))
        for i, branch in enumerate(branches):
            parts = [branch]
            within = kinds_of(schema) & kinds_of(branch)  # ¬other only where branch can be
            given = self.given(rest, branch)  # what the instances ¬other is taken over satisfy
            for j, other in enumerate(branches):
                if i == j:
                    continue
                separate = apart(branch, other, self.root) & within
                if separate == within:
                    continue
                # kinds proven apart are outside ``other`` already; negate it on the rest
                negated = self._failing(given, f"{path}/oneOf/{j}")
                if negated is None:
                    negated = negate(
                        other, within - separate, self.root, closed_keys(branch, self.root), given
                    )
                separate_type = type_of(separate) if separate else None
                if negated is None or (separate and separate_type is None):
                    return None
                parts.append(any_of([{"type": separate_type} if separate else False, negated]))
            exclusive.append(all_of(parts))
        del schema["oneOf"]
        return [any_of(exclusive)]


_DRAFT_ORDER = (validators.Draft4Validator, validators.Draft6Validator, *DRAFTS)


_NEGATING = frozenset({"not", "if", "oneOf"})  # keywords the rules rewrite by negation


def _removed_by(draft: Any) -> frozenset[str]:
    """Keywords an earlier draft defined that ``draft`` no longer does (``dependencies``)."""
    if draft not in _DRAFT_ORDER:
        return frozenset()
    at = _DRAFT_ORDER.index(draft)
    earlier = frozenset().union(*(d.VALIDATORS for d in _DRAFT_ORDER[:at]))
    return earlier - set(draft.VALIDATORS) - {"exclusiveMinimum", "exclusiveMaximum"}


def _introduced_after(draft: Any) -> frozenset[str]:
    """Keywords no draft up to ``draft`` defines, but a later one does."""
    if draft not in _DRAFT_ORDER:
        return frozenset()
    at = _DRAFT_ORDER.index(draft) + 1
    # Draft 4's exclusiveMinimum / exclusiveMaximum are booleans its minimum / maximum read.
    known = frozenset({"exclusiveMinimum", "exclusiveMaximum"}).union(
        *(d.VALIDATORS for d in _DRAFT_ORDER[:at])
    )
    return frozenset().union(*(d.VALIDATORS for d in _DRAFT_ORDER[at:])) - known


_PLAIN_BESIDE_ENUM = ANNOTATIONS | {"enum", "const", "type"}
_KEPT_BESIDE_ENUM = ANNOTATIONS  # ``$defs`` / ``definitions`` stay for the $refs into them


def _within(pointer: str, prefixes: list[str]) -> bool:
    """``pointer`` is one of ``prefixes`` or inside one."""
    return any(pointer == p or pointer.startswith(p + "/") for p in prefixes)


def _uri_reference() -> str:
    """RFC 3986's ``URI-reference`` (section 4.1) as an anchored ECMA-262 pattern, rule by
    rule from its collected ABNF (appendix A); ASCII only (IRIs are another format)."""
    unreserved, pct, sub = r"[A-Za-z0-9\-._~]", "%[0-9A-Fa-f]{2}", "[!$&'()*+,;=]"
    pchar = f"(?:{unreserved}|{pct}|{sub}|[:@])"
    h16, octet = "[0-9A-Fa-f]{1,4}", "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ipv4 = rf"{octet}\.{octet}\.{octet}\.{octet}"
    ls32 = f"(?:{h16}:{h16}|{ipv4})"
    ipv6 = "|".join(
        [f"(?:{h16}:){{6}}{ls32}", f"::(?:{h16}:){{5}}{ls32}", f"(?:{h16})?::(?:{h16}:){{4}}{ls32}"]
        + [
            f"(?:(?:{h16}:){{0,{n - 1}}}{h16})?::{middle}"
            for n, middle in [
                (2, f"(?:{h16}:){{3}}{ls32}"), (3, f"(?:{h16}:){{2}}{ls32}"),
                (4, f"{h16}:{ls32}"), (5, ls32), (6, h16), (7, ""),
            ]
        ]
    )  # fmt: skip
    ip_future = rf"v[0-9A-Fa-f]+\.(?:{unreserved}|{sub}|:)+"
    host = rf"(?:\[(?:{ipv6}|{ip_future})\]|(?:{unreserved}|{pct}|{sub})*)"
    authority = f"(?:(?:{unreserved}|{pct}|{sub}|:)*@)?{host}(?::[0-9]*)?"
    segments = f"(?:/{pchar}*)*"
    after_path = f"(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"  # query, fragment
    absolute = f"/(?:{pchar}+{segments})?"
    hier_part = f"//{authority}{segments}|{absolute}|{pchar}+{segments}|"
    relative_part = f"//{authority}{segments}|{absolute}|(?:{unreserved}|{pct}|{sub}|@)+{segments}|"
    uri = f"[A-Za-z][A-Za-z0-9+\\-.]*:(?:{hier_part}){after_path}"
    return f"^(?:{uri}|(?:{relative_part}){after_path})$"


def _full_date() -> str:
    """RFC 3339's ``full-date`` (section 5.6) with its limits (section 5.7): each month's
    days, February 29 in leap years only (divisible by 4, centuries by 400); years 0001 to
    9999, as jsonschema judges a date (Python's ``date`` has no year 0)."""
    year = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
    days = (
        "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
        "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    )
    by_four = "(?:0[48]|[2468][048]|[13579][26])"  # two digits divisible by 4, but 00
    leap = f"(?:[0-9]{{2}}{by_four}|{by_four}00)"
    return f"^(?:{year}-{days}|{leap}-02-29)$"


_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
# Formats JSON Schema defines that backends do not know (or check loosely), as the exact
# pattern of their RFC (strings only, as ``format`` and ``pattern`` both are): checked
# against the JSON-Schema-Test-Suite's ``optional/format`` groups
# (``tests/test_schema_rewrite.py``).
FORMAT_PATTERNS = {
    "date": _full_date(),  # xgrammar's own lets 2020-02-30 and 2020-04-31 through
    "uri-reference": _uri_reference(),
    "json-pointer": f"^{_JSON_POINTER}$",  # RFC 6901
    "relative-json-pointer": f"^(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})$",
}


def _key_regex(names: Any) -> str | None:
    """One ECMA-262 pattern (searched, as ``pattern`` is) matching exactly the strings
    ``names`` accepts, or ``None`` (two keywords at once, non-string kinds that matter...)."""
    if not isinstance(names, dict):
        return None
    own = {k: v for k, v in names.items() if k not in ANNOTATIONS}
    if own.get("type") in ("string", ["string"]):
        del own["type"]  # keys are strings
    if set(own) == {"pattern"} and isinstance(own["pattern"], str):
        return own["pattern"]
    values = values_of(own)
    if values is not None and set(own) in ({"const"}, {"enum"}):
        strings = [v for v in values if isinstance(v, str)]
        if any(ord(ch) > 0xFFFF for text in strings for ch in text):
            return None  # two UTF-16 units to ECMA-262
        return "^(?:" + "|".join(literal(v) for v in strings) + ")$" if strings else "[^\\s\\S]"
    if own and set(own) <= {"minLength", "maxLength"}:
        low, high = own.get("minLength", 0), own.get("maxLength", "")
        if not (is_int(low) and (high == "" or is_int(high))):
            return None
        return f"^[\\s\\S]{{{low},{high}}}$"
    return None


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


def _without(schema: dict, keywords: tuple[str, ...]) -> dict:
    """``schema`` less ``keywords`` (the ones a rule replaces: never assumed while
    computing their replacement)."""
    return {k: v for k, v in schema.items() if k not in keywords}


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


def _only_keyword(schema: Any, keyword: str) -> bool:
    """``schema`` is an object whose one validation keyword is ``keyword``."""
    return (
        isinstance(schema, dict)
        and keyword in schema
        and not [k for k in schema if k != keyword and k in VALIDATION_KEYWORDS]
    )


def _uses_unevaluated(schema: Any) -> bool:
    text = json.dumps(schema)
    return '"unevaluatedProperties"' in text or '"unevaluatedItems"' in text
