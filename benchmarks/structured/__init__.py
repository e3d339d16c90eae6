"""The pieces of ``benchmarks/e2e_structured.py`` (JSON-schema output end to end).

``python -m benchmarks.e2e_structured`` is the command line; this package does the work:

- ``schemas``: MaskBench files: splits, loading a schema, its prompt, the stratified sample;
- ``configs``: the configurations compared (``none``, ours, vLLM's built-in): what each adds
  to a request and to the engine, the request seeds, the children's environment;
- ``outcomes``: judging one output with ``jsonschema``, refusal wording, counts over requests;
- ``selection``: the ``_select`` child: the schemas that both sides accept;
- ``steps``: timing each engine step and the least-squares fit of step time vs occupancy;
- ``timed_run``: the ``_run`` child: one configuration, one engine, a cold then a timed call;
- ``throughput``: the ``throughput`` parent: children alternated over rounds, the report;
- ``validity``: the ``validity`` subcommand: admission one by one, one batched call, checks;
- ``report``: summaries, console tables and JSON files of both subcommands (no engine);
- ``plot``: the throughput PNG, from a report (no engine).

Nothing here imports vLLM, torch or jsonschema at module level: the parent process and
``--help`` stay light, and each child sets its environment before vLLM is imported.

This module owns the repository root (children run there) and the code's fingerprint.
"""

from __future__ import annotations

import hashlib
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def script_digest() -> str:
    """sha1 (12 hex digits) of the benchmark's code: ``e2e_structured.py`` and this package.

    The parent and each child record it (``script_sha1``), so a copy edited mid-run shows.
    """
    package = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha1()
    for path in [package.parent / "e2e_structured.py", *sorted(package.glob("*.py"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
