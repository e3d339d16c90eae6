"""Soak: our server under concurrent mixed load, faults and bad input (``tests/soak.py``).

The harness lives with the tests (``tests/test_soak.py`` runs a short soak in CI); this is its
command line, which adds the machine's description and writes the report.

Usage::

    python -m benchmarks.soak                        # 5 rounds of 60 s, 64 clients
    python -m benchmarks.soak --rounds 2 --round-s 20 # quick
    python -m benchmarks.soak --out benchmarks/results/soak.json
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.common import machine_info
from tests.soak import parse_args, run


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    report = {"machine": machine_info(), **run(args)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    summary = {k: report[k] for k in ("requests", "preemptions", "failure_count", "wall_s")}
    print(json.dumps(summary))
    for line in report["failures"][:20]:
        print("FAIL", line)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
