"""``schema/meta_schema.py``: the merged meta-schemas of drafts 2019-09 and 2020-12 accept
exactly what the drafts' own accept, and ``check`` refuses with the drafts' own errors.

Compared over every schema of the JSON-Schema-Test-Suite (draft 2020-12 and draft 7), a
sample of MaskBench (every draft it has), and mutations of both: at each subschema, one
keyword set to a value of the wrong kind or range (a type name that is none, a negative
count, a pattern that does not compile, a subschema that is not one...).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from jsonschema import exceptions, validators

from constrained.schema import meta_schema
from tests.soak import MASKBENCH
from tests.test_schema_suite import SUITE

DEFAULT = validators.Draft202012Validator
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
# One wrong value per keyword; each makes a schema invalid under every draft that has it.
WRONG = {
    "type": "text", "minimum": "1", "maxLength": -1, "minItems": 1.5, "required": "a",
    "properties": [], "items": 3, "enum": {}, "pattern": "([a-", "format": 7,
    "additionalProperties": "no", "allOf": [], "anyOf": {}, "not": 1, "multipleOf": 0,
    "$ref": 5, "uniqueItems": "yes", "dependentRequired": {"a": [1]}, "$anchor": "1bad",
    "const": None, "prefixItems": {}, "contains": "x", "$defs": [], "title": 3,
}  # fmt: skip


def official_valid(schema: Any) -> bool:
    draft = validators.validator_for(schema, default=DEFAULT)
    try:
        draft.check_schema(schema)
    except exceptions.SchemaError:
        return False
    return True


def merged_valid(schema: Any) -> bool:
    draft = validators.validator_for(schema, default=DEFAULT)
    return meta_schema._fast_validator(draft).is_valid(schema)


def suite_schemas() -> list[Any]:
    if not SUITE.is_dir():
        pytest.fail(f"JSON-Schema-Test-Suite not found at {SUITE}")
    found = []
    for folder, draft in ((SUITE, None), (SUITE.parent / "draft7", DRAFT7)):
        for path in sorted(folder.rglob("*.json")):
            for case in json.loads(path.read_text()):
                schema = case["schema"]
                if draft and isinstance(schema, dict):
                    schema = {"$schema": draft, **schema}  # (the folder names its draft)
                found.append(schema)
    return found


def maskbench_schemas(every: int) -> list[Any]:
    """Every ``every``-th MaskBench schema, and each that names draft 2019-09."""
    paths = sorted(MASKBENCH.glob("*.json"))
    found = [json.loads(p.read_text())["schema"] for p in paths[::every]]
    for path in paths:
        schema = json.loads(path.read_text())["schema"]
        if "draft2019" in path.name and isinstance(schema, dict):
            found.append({"$schema": DRAFT2019, **schema})  # (the file names its draft)
    return found


def mutations(schemas: list[Any], count: int, seed: int = 0) -> list[Any]:
    """``count`` copies of schemas drawn from ``schemas``, each with one keyword of one of
    its object subschemas set to a wrong value."""
    rng = random.Random(seed)
    objects = [s for s in schemas if isinstance(s, dict)]
    out = []
    while len(out) < count:
        schema = copy.deepcopy(rng.choice(objects))
        nodes = [node for node in _subschemas(schema) if isinstance(node, dict)]
        keyword = rng.choice(sorted(WRONG))
        rng.choice(nodes)[keyword] = WRONG[keyword]
        out.append(schema)
    return out


def _subschemas(node: Any) -> list[dict]:
    found = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "type" in item or "properties" in item or item is node:
                found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_merged_meta_schemas_have_every_keyword_of_their_vocabularies():
    for draft in (validators.Draft202012Validator, validators.Draft201909Validator):
        merged = meta_schema.merged(draft.META_SCHEMA)
        assert "allOf" not in merged and len(merged["properties"]) > 55
        text = json.dumps(merged)
        # (the keywords' names stay, as properties the meta-schema describes)
        assert '"$dynamicRef": "#meta"' not in text and '"$recursiveRef": "#"' not in text
        assert "meta/" not in text
    assert meta_schema.merged(validators.Draft7Validator.META_SCHEMA) is (
        validators.Draft7Validator.META_SCHEMA
    )


def test_merged_meta_schemas_accept_what_the_drafts_accept():
    schemas = suite_schemas() + maskbench_schemas(every=29)
    drafts = {validators.validator_for(s, default=DEFAULT).__name__ for s in schemas}
    assert {"Draft202012Validator", "Draft201909Validator", "Draft7Validator"} <= drafts
    wrong = mutations(schemas, 1000)
    differing = [s for s in schemas + wrong if merged_valid(s) != official_valid(s)]
    assert differing == []
    refused = sum(not official_valid(s) for s in wrong)
    assert refused > 700  # the mutations reach the keywords they break


def test_check_raises_the_drafts_own_error():
    schema = {"type": "object", "properties": {"a": {"minLength": -1}}}
    with pytest.raises(exceptions.SchemaError) as ours:
        meta_schema.check(schema)
    with pytest.raises(exceptions.SchemaError) as theirs:
        DEFAULT.check_schema(schema)
    assert (ours.value.message, list(ours.value.absolute_path)) == (
        theirs.value.message,
        list(theirs.value.absolute_path),
    )
    meta_schema.check({"type": "object", "properties": {"a": {"minLength": 1}}})
