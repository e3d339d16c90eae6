"""Check a schema against its draft's meta-schema, fast.

Drafts 2019-09 and 2020-12 split their meta-schema into vocabularies: an ``allOf`` of seven
schemas, each naming its own keywords under ``properties`` and reaching subschemas through
``$recursiveRef`` / ``$dynamicRef``. ``jsonschema`` walks each subschema of a user's schema
once per vocabulary and resolves a dynamic reference at each step: 10-20 ms a MaskBench
schema, the largest part of admitting a new one. ``merged`` is the same meta-schema as one
schema: the vocabularies name disjoint keywords with the same ``type``, so the ``allOf`` of
them accepts what the union of their ``properties`` accepts; and the dynamic references all
land on the root, since the meta-schema is not extended, so they are plain ``$ref: "#"``.
It accepts what the draft's own accepts (``tests/test_meta_schema.py`` checks it over the
JSON-Schema-Test-Suite's schemas, MaskBench and mutations of both); a schema it refuses is
checked again by the draft's own, whose error message names the place.

Example::

    check(json.loads('{"type": 5}'))  # raises jsonschema.exceptions.SchemaError
"""

from __future__ import annotations

import functools
from typing import Any

_VOCABULARY_DRAFTS = {
    "https://json-schema.org/draft/2020-12/schema": "https://json-schema.org/draft/2020-12/",
    "https://json-schema.org/draft/2019-09/schema": "https://json-schema.org/draft/2019-09/",
}
_DYNAMIC = ("$dynamicRef", "$recursiveRef")  # each refers to the root here
_DROPPED = {"$id", "$schema", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor"}


def check(schema: Any) -> None:
    """Raise ``jsonschema.exceptions.SchemaError`` when ``schema`` is not valid under its
    draft's meta-schema (``$schema``; 2020-12 when it names none), as ``check_schema`` does."""
    from jsonschema import validators

    draft = validators.validator_for(schema, default=validators.Draft202012Validator)
    if _fast_validator(draft).is_valid(schema):
        return
    draft.check_schema(schema)  # (the draft's own: its error names the place)


@functools.cache
def _fast_validator(draft: type) -> Any:
    """A validator of ``draft``'s meta-schema (merged, for drafts with vocabularies), kept
    for the process: made once, not per schema as ``check_schema`` makes it."""
    schema = merged(draft.META_SCHEMA)
    return draft(schema, format_checker=draft.FORMAT_CHECKER)


def merged(meta_schema: dict[str, Any]) -> dict[str, Any]:
    """``meta_schema`` with its vocabularies merged into one schema (unchanged for drafts
    without vocabularies)."""
    base = _VOCABULARY_DRAFTS.get(meta_schema.get("$id", ""))
    if base is None:
        return meta_schema
    from jsonschema_specifications import REGISTRY

    parts = [
        meta_schema,
        *(REGISTRY.contents(base + part["$ref"]) for part in meta_schema["allOf"]),
    ]
    out: dict[str, Any] = {"type": meta_schema["type"], "properties": {}, "$defs": {}}
    for part in parts:
        if part.get("type", out["type"]) != out["type"]:
            raise ValueError(f"a vocabulary of {base} has another type")
        for section in ("properties", "$defs"):
            entries = part.get(section, {})
            if not out[section].keys().isdisjoint(entries):
                raise ValueError(f"vocabularies of {base} share {section} names")
            out[section].update({name: _local(sub) for name, sub in entries.items()})
        if set(part) - {"allOf", "properties", "$defs", "type", "title", "$comment"} - _DROPPED:
            raise ValueError(f"a vocabulary of {base} has keywords this merge does not know")
    return out


_SCHEMA_MAPS = {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
_SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
_SCHEMAS = {"additionalProperties", "items", "additionalItems", "not", "propertyNames",
            "contains", "if", "then", "else", "unevaluatedItems",
            "unevaluatedProperties"}  # fmt: skip


def _local(schema: Any) -> Any:
    """``schema`` (a part of a meta-schema) with each dynamic reference as ``{"$ref": "#"}``
    and each other reference into a vocabulary (``meta/validation#/$defs/x``, ``#/$defs/x``)
    as one into the merged ``$defs``."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DYNAMIC:
            out["$ref"] = "#"
        elif key == "$ref":
            pointer = value.partition("#")[2]
            if not pointer.startswith("/$defs/"):
                raise ValueError(f"a reference this merge does not know: {value}")
            out["$ref"] = "#" + pointer
        elif key in _DROPPED:
            continue
        elif key in _SCHEMA_MAPS:
            out[key] = {name: _local(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS or (key in _SCHEMAS and isinstance(value, list)):
            out[key] = [_local(sub) for sub in value]
        elif key in _SCHEMAS:
            out[key] = _local(value)
        else:  # (a value, not a schema: type, enum, default, format...)
            out[key] = value
    return out
