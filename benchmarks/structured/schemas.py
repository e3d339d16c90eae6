"""MaskBench schemas: where they live, their splits, loading one, its prompt, the sample.

Pure file work (no vLLM): both subcommands get their schemas and prompts from here, so both
sides of a comparison see the same JSON text and the same prompt.
"""

from __future__ import annotations

import collections
import json
import pathlib
import random
from typing import Any

from benchmarks.structured import REPO_ROOT

DEFAULT_MASKBENCH = REPO_ROOT.parent / "shared" / "data" / "maskbench"
# Splits of MaskBench, by file-name prefix (all BFCL_* files are one split).
SPLITS: tuple[str, ...] = (
    "Github_trivial",
    "Github_easy",
    "Github_medium",
    "Github_hard",
    "Github_ultra",
    "Glaiveai2K",
    "Kubernetes",
    "Snowplow",
    "WashingtonPost",
    "JsonSchemaStore",
    "BFCL",
    "MCPspec",
    "JME",
    "Synthesized",
    "Handwritten",
)


def split_of(name: str) -> str | None:
    """The split a MaskBench file name belongs to (``None`` for a name of no known split)."""
    for split in SPLITS:
        if name.startswith(split):
            return split
    return None


def load_schema(maskbench: pathlib.Path, name: str) -> Any:
    """The ``schema`` of MaskBench file ``name``."""
    return json.loads((maskbench / name).read_text())["schema"]


def schema_text(schema: Any) -> str:
    """The one JSON text both sides get (vLLM would ``json.dumps`` a dict the same way)."""
    return json.dumps(schema)


def prompt_for(name: str) -> str:
    """The prompt of the request that carries MaskBench file ``name``'s schema."""
    return f"Reply with one JSON value that matches the schema {name.removesuffix('.json')}.\n"


def sample_splits(maskbench: pathlib.Path, per_split: int, seed: int) -> list[str]:
    """Up to ``per_split`` file names drawn with ``seed`` from each split, in ``SPLITS`` order."""
    by_split: dict[str, list[str]] = collections.defaultdict(list)
    for p in sorted(maskbench.glob("*.json")):
        split = split_of(p.name)
        if split is not None:
            by_split[split].append(p.name)
    rng = random.Random(seed)
    chosen = []
    for split in SPLITS:
        names = by_split.get(split, [])
        chosen.extend(sorted(rng.sample(names, min(per_split, len(names)))))
    return chosen
