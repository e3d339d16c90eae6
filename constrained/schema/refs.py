"""Local, non-recursive ``$ref`` inlined: the schema written out where each reference sits.

Pydantic writes every ``Enum`` field and every nested model as a ``$ref`` into ``$defs``.
Some readers of a schema do not follow references: vLLM's Qwen3 XML tool parser types each
parameter by the schema as written (a ``$ref`` reads as a string). ``inline_local_refs``
gives the same schema with each local reference (``#/$defs/...``, ``#/definitions/...``, any
``#/...`` pointer into the document) replaced by a copy of what it points at, so every reader
sees one schema. What cannot be inlined stays as written, and whoever refuses ``$ref`` still
does, naming it:

- a recursive reference (its target reaches it again, through the references inside;
  ``#`` included);
- a remote, anchor (``#name``) or dangling reference;
- any reference of a schema with nested resources (``$id`` below the root), where a pointer
  resolves against another base; and all of them when inlining would write more than
  ``MAX_INLINED`` schema objects (references that fan out exponentially).

A ``$ref`` with sibling keywords (2019-09 / 2020-12: both apply) becomes the target with the
siblings merged in when that means the same (annotations only; or keywords the target does
not have and that do not depend on each other, see ``negation._DEPENDS_ON``), else
``{"allOf": [target], ...siblings}``. ``$defs`` / ``definitions`` at the root are dropped
once nothing refers to them. The input is never changed.

Example::

    >>> inline_local_refs({"$defs": {"C": {"enum": ["a", "b"]}},
    ...                    "properties": {"c": {"$ref": "#/$defs/C", "title": "C"}}})
    {'properties': {'c': {'enum': ['a', 'b'], 'title': 'C'}}}
"""

from __future__ import annotations

import copy
from typing import Any

from constrained.schema.negation import _DEPENDS_ON
from constrained.schema.walk import (
    ANNOTATIONS,
    local_refs,
    map_subschemas,
    nested_resources,
    resolve_pointer,
)

MAX_INLINED = 10_000  # schema objects written out, at most
_DEFINITIONS = ("$defs", "definitions")
_NEVER_MERGED = frozenset({"unevaluatedProperties", "unevaluatedItems", "$ref", "$dynamicRef",
                           "$recursiveRef", "$id", "id", "$anchor", "$dynamicAnchor"})  # fmt: skip


class _TooLarge(Exception):
    pass


def has_local_refs(schema: Any) -> bool:
    """Whether ``schema`` holds a local ``$ref`` anywhere (data values included)."""
    return next(local_refs(schema), None) is not None


def inline_local_refs(schema: Any) -> Any:
    """A copy of ``schema`` with its local, non-recursive ``$ref`` inlined (see the module
    docstring); ``schema`` itself when there is nothing to inline or it cannot be."""
    if not isinstance(schema, dict) or not has_local_refs(schema):
        return schema
    if next(nested_resources(schema), None) is not None:
        return schema
    budget = [MAX_INLINED]
    cyclic = _recursive_refs(schema)

    def expand(node: Any, path: str) -> Any:
        if not isinstance(node, dict):
            return copy.deepcopy(node)
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge
        ref = node.get("$ref")
        target = resolve_pointer(schema, ref) if isinstance(ref, str) else None
        if (
            target is None
            or not isinstance(target, dict | bool)
            or ref in cyclic
            or not ref.startswith("#/")
        ):
            out = _copied(node)
            map_subschemas(out, path, expand)
            return out
        siblings = _copied({k: v for k, v in node.items() if k != "$ref"})
        map_subschemas(siblings, path, expand)
        inlined = expand(target, ref)
        return _merged(inlined, siblings)

    try:
        out = expand(schema, "#")
    except (_TooLarge, RecursionError):
        return schema
    if not any(ref.startswith("#/") for _, ref in local_refs(_without_definitions(out))):
        out = _without_definitions(out)
    return schema if out == schema else out


def _recursive_refs(schema: dict[str, Any]) -> frozenset[str]:
    """The local ``$ref`` values of ``schema`` whose target reaches the same ``$ref`` again
    (through the references inside it), ``#`` included."""
    edges: dict[str, set[str]] = {}
    pending = [ref for _, ref in local_refs(schema)]
    while pending:
        ref = pending.pop()
        if ref in edges:
            continue
        target = resolve_pointer(schema, ref)
        edges[ref] = {inner for _, inner in local_refs(target)} if target is not None else set()
        pending.extend(edges[ref])
    cyclic = set()
    for start in edges:
        seen, stack = set(), list(edges[start])
        while stack:
            ref = stack.pop()
            if ref == start:
                cyclic.add(start)
                break
            if ref not in seen:
                seen.add(ref)
                stack.extend(edges.get(ref, ()))
    return frozenset(cyclic)


def _merged(target: Any, siblings: dict[str, Any]) -> Any:
    """The schema of ``{"$ref": <target>, **siblings}``."""
    if not siblings:
        return target
    if target is True or target == {}:
        return siblings
    if target is False:
        return _all_of(False, siblings)
    keywords = {k for k in siblings if k not in ANNOTATIONS}
    if not keywords:
        return {**target, **siblings}
    theirs = {k for k in target if k not in ANNOTATIONS}
    mixed = keywords & theirs or (keywords | theirs) & _NEVER_MERGED
    for key in keywords:
        mixed = mixed or bool(set(_DEPENDS_ON.get(key, ())) & theirs)
    for key in theirs:
        mixed = mixed or bool(set(_DEPENDS_ON.get(key, ())) & keywords)
    if mixed:
        return _all_of(target, siblings)
    return {**target, **siblings}


def _all_of(target: Any, siblings: dict[str, Any]) -> dict[str, Any]:
    return {**siblings, "allOf": [target, *(siblings.get("allOf") or [])]}


def _copied(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its containers copied one level down (``map_subschemas`` assigns into
    them), its other values deep-copied."""
    return {
        k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
        for k, v in copy.deepcopy(node).items()
    }


def _without_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in _DEFINITIONS}
