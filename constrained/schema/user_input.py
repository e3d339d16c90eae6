"""Turn what a user passes as ``json_schema`` into checked JSON text.

Accepted: JSON text, a dict (or ``true``/``false``), or a pydantic model class. Refused, with
the reason: text that is not JSON, a schema its draft's meta-schema rejects, a schema larger
than ``CONSTRAINED_MAX_SCHEMA_BYTES`` (default 4 MiB) or nested deeper than 128 levels,
local ``$ref`` chains that loop without describing anything, and a schema no value satisfies
(``satisfiable.no_instance``: the message names the keywords that contradict).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from constrained.schema.satisfiable import no_instance
from constrained.schema.walk import iter_subschemas, local_refs, resolve_pointer
from constrained.settings import settings

MAX_SCHEMA_BYTES_ENV = "CONSTRAINED_MAX_SCHEMA_BYTES"
MAX_DEPTH = 128


def schema_text(value: Any, check: bool = True) -> str | None:
    """The schema as JSON text; raises ``ValueError`` saying what is wrong. ``check``
    false: the text of a schema these checks passed before (the same text either way)."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseModel):
        value = value.model_json_schema()
    if isinstance(value, str):
        _check_size(len(value.encode()))
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, Mapping | bool):
        raise ValueError(
            f"must be a JSON schema (object), JSON text or a pydantic model class, "
            f"got {type(value).__name__}"
        )
    _check_depth(value)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    _check_size(len(text.encode()))
    return _checked(text) if check else text


@functools.lru_cache(maxsize=256)
def _checked(text: str) -> str:
    """Meta-schema and ``$ref`` checks, once per distinct schema: vLLM validates and adds a
    request once per registered processor, and requests repeat schemas."""
    value = json.loads(text)
    _check_meta_schema(value)
    _check_ref_loops(value)
    contradiction = no_instance(value)
    if contradiction is not None:
        raise ValueError(contradiction.message())
    return text


def _check_size(size: int) -> None:
    limit = settings().max_schema_bytes
    if size > limit:
        raise ValueError(f"is {size:,} bytes, more than {limit:,} ({MAX_SCHEMA_BYTES_ENV})")


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, Mapping) else node
        if isinstance(node, Mapping | list):
            stack.extend((child, depth + 1) for child in children)


def _check_meta_schema(value: Any) -> None:
    from jsonschema import exceptions

    from constrained.schema import meta_schema

    try:
        meta_schema.check(value)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"not a valid JSON schema at {where}: {exc.message:.200}") from None
    except RecursionError:
        raise ValueError("too deeply nested to check") from None


def _check_ref_loops(root: Any) -> None:
    """Refuse ``{"$ref": A}`` -> ``{"$ref": B}`` -> ... -> A: it describes no value at all."""
    for node, ref in local_refs(root):
        seen = {id(node)}
        target = resolve_pointer(root, ref)
        while isinstance(target, Mapping) and set(target) - _ANNOTATIONS == {"$ref"}:
            if id(target) in seen:
                raise ValueError(f"'$ref' loop: {ref!r} refers back to itself")
            seen.add(id(target))
            next_ref = target["$ref"]
            if not (isinstance(next_ref, str) and next_ref.startswith("#")):
                break
            target = resolve_pointer(root, next_ref)


# The keywords by which an object schema says what extra keys (beyond ``properties``) get.
EXTRA_KEY_KEYWORDS = frozenset({"additionalProperties", "patternProperties",
                                "unevaluatedProperties"})  # fmt: skip


def says_extra_keys(schema: Mapping[str, Any]) -> bool:
    """Whether an object schema says what keys beyond its ``properties`` get."""
    return not EXTRA_KEY_KEYWORDS.isdisjoint(schema)


def close_objects(text: str) -> str:
    """The schema with ``"additionalProperties": false`` wherever an object schema is silent
    about extra keys (vLLM's ``disable_additional_properties``, xgrammar's strict mode).

    Every output still validates against the original schema; it just cannot add keys.
    Refused for schemas with ``allOf``: closing each branch would forbid the others' keys.
    """
    schema = json.loads(text)
    for path, sub in iter_subschemas(schema):
        if "allOf" in sub:
            raise ValueError(f"cannot close objects of a schema with 'allOf' (at {path})")
        is_object = sub.get("type") == "object" or "properties" in sub
        if is_object and not says_extra_keys(sub):
            sub["additionalProperties"] = False
    return json.dumps(schema, ensure_ascii=False)


_ANNOTATIONS = {"$comment", "title", "description", "$id", "$anchor", "default", "examples"}
