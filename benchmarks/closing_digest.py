"""A digest of every mask row ``closing_walks`` fills, per schema: the guard for a change to
closing that must not change its masks (#54: "the same masks bit for bit").

Runs ``benchmarks.closing_walks`` with the arguments given (its seeds are the schemas'
names, so two runs walk the same paths while the masks agree) and hashes each row it
fills, closing on and off, into one SHA-256 per schema. Compare two runs' files with
``--compare``::

    python -m benchmarks.closing_digest --out /tmp/before -- --schemas 150 --walks 4
    python -m benchmarks.closing_digest --out /tmp/after -- --schemas 150 --walks 4
    python -m benchmarks.closing_digest --compare /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys


def _record(argv: list[str], out: pathlib.Path) -> int:
    import benchmarks.closing_walks as walks_bench
    import tests.closing_walk as closing_walk

    digests: dict[str, hashlib._Hash] = {}
    current = ["(none)"]
    allowed, run_schema = closing_walk.allowed, walks_bench.run_schema

    def hashed_allowed(matcher, bitmask, row, width):  # type: ignore[no-untyped-def]
        ids = allowed(matcher, bitmask, row, width)
        digests.setdefault(current[0], hashlib.sha256()).update(bitmask[row].numpy().tobytes())
        return ids

    def named_run(name, *rest):  # type: ignore[no-untyped-def]
        current[0] = name
        return run_schema(name, *rest)

    closing_walk.allowed = hashed_allowed
    walks_bench.run_schema = named_run
    rc = walks_bench.main([*argv, "--schema-seconds", "1e9", "--out", str(out)])
    result = {name: digest.hexdigest() for name, digest in sorted(digests.items())}
    (out / "digests.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result)} schemas digested; closing_walks rc {rc}")
    return rc


def _compare(before: pathlib.Path, after: pathlib.Path) -> int:
    a = json.loads((before / "digests.json").read_text())
    b = json.loads((after / "digests.json").read_text())
    differ = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
    print(f"{len(a)} / {len(b)} schemas; {len(differ)} differ")
    for name in differ[:20]:
        print("  differs:", name)
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--compare", type=pathlib.Path, nargs=2)
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(*args.compare)
    return _record(rest, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
