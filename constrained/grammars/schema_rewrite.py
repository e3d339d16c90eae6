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

import copy
import functools
import json
from typing import Any

from constrained.grammars.schema_negation import (
    KINDS,
    all_of,
    any_of,
    apart,
    closed_keys,
    kinds_of,
    lacks,
    negate,
    type_of,
)
from constrained.grammars.schema_walk import (
    VALIDATION_KEYWORDS,
    escape_pointer,
    is_number,
    is_unknown_format,
    local_refs,
    map_subschemas,
)

MAX_ONE_OF_BRANCHES = 8  # oneOf by negation costs n² negations


@functools.lru_cache(maxsize=256)
def rewrite_schema_text(text: str) -> str:
    """``rewrite_schema`` over JSON text; the same text when nothing was rewritten. Cached:
    ``auto`` asks once per backend it tries."""
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
    return _Rewriter(schema, {ref for _, ref in local_refs(schema)}).node(schema, "#")


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
        negated = negate(condition, kinds_of(schema), self.root)
        if negated is None:
            return None
        branches = [
            all_of([condition, schema.get("then", True)]),
            all_of([negated, schema.get("else", True)]),
        ]
        for key in ("if", "then", "else"):
            schema.pop(key, None)
        return [any_of(branches)]

    def _dependencies(self, schema: dict, keyword: str) -> list[Any] | None:
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

    def _not(self, schema: dict, _: str) -> list[Any] | None:
        negated = negate(schema["not"], kinds_of(schema), self.root)
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
            within = kinds_of(schema) & kinds_of(branch)  # ¬other only where branch can be
            for j, other in enumerate(branches):
                if i == j:
                    continue
                separate = apart(branch, other, self.root) & within
                if separate == within:
                    continue
                # kinds proven apart are outside ``other`` already; negate it on the rest
                negated = negate(
                    other, within - separate, self.root, closed_keys(branch, self.root)
                )
                separate_type = type_of(separate) if separate else None
                if negated is None or (separate and separate_type is None):
                    return None
                parts.append(any_of([{"type": separate_type} if separate else False, negated]))
            exclusive.append(all_of(parts))
        del schema["oneOf"]
        return [any_of(exclusive)]


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
