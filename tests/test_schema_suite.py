"""JSON-Schema-Test-Suite (draft 2020-12): no backend accepts an instance its schema forbids.

Every group of the suite's core files, ``optional/`` and ``optional/format/`` is compiled
with ``auto`` and with each explicit backend (``compile_now``, so xgrammar and outlines go
through their backend module's allow-list, ``grammars/allow_list.py``). For each schema a
backend accepts, every instance is serialized compactly and walked token by token
(``tests.walker.Walker``: the mask before each token must allow it, and end-of-sequence after
the last); an invalid instance
that walks through means a keyword the backend does not enforce, and fails the test.

The suite's core schemas rarely declare ``type`` (``{"minLength": 2}``), which xgrammar and
outlines are refused for, so each such group also runs *typed*: with the ``type`` its
keywords imply added and only the instances of that type kept (their validity is unchanged).

``format`` is an assertion here, as the ``optional/format`` labels have it (jsonschema only
checks a few formats, and only with a ``FormatChecker``). ``KNOWN_GAPS`` lists the cases a
backend may let through (leap years: llguidance's ``date``, not the exact pattern xgrammar
and outlines get; leap seconds, IDNA/Punycode rules, the 255-character hostname
limit) with the reason. Valid instances rejected are reported, not failed: a backend may be
stricter (formats as assertions, ``1.0`` is no integer in its grammar, property order).
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from constrained.grammars import GrammarError, GrammarSpec, compile_now
from constrained.schema.walk import json_type
from tests.walker import Walker

SUITE = (
    pathlib.Path(__file__).resolve().parents[2]
    / "shared" / "data" / "json-schema-test-suite" / "tests" / "draft2020-12"
)  # fmt: skip
FOLDERS = {"core": ".", "optional": "optional", "format": "optional/format"}  # file prefixes
WIDTH = 151_936

# (file, test description): invalid instances no backend rejects, and why. Everything else
# a backend accepts must be right.
_LEAP_SECOND = "a leap second is valid only at 23:59:60 UTC: needs the offset arithmetic"
_LEAP_YEAR = "February 29 of a non-leap year: needs the year modulo 4/100/400"
_IDNA = "IDNA 2008 / Punycode validity of an A-label is not a regular language in practice"
KNOWN_GAPS: dict[tuple[str, str], str] = {
    **{
        ("format/date-time", d): _LEAP_SECOND
        for d in (
            "an invalid date-time with leap second on a wrong minute, UTC",
            "an invalid date-time with leap second on a wrong hour, UTC",
        )
    },
    **{
        ("format/date", d): _LEAP_YEAR
        for d in (
            "2021 is not a leap year",
            "century year 0100 is not a leap year",
            "century year 2100 is not a leap year",
        )
    },
    **{
        ("format/time", d): _LEAP_SECOND
        for d in (
            "invalid leap second, Zulu (wrong hour)",
            "invalid leap second, Zulu (wrong minute)",
            "invalid leap second, zero time-offset (wrong hour)",
            "invalid leap second, zero time-offset (wrong minute)",
            "invalid leap second, positive time-offset (wrong hour)",
            "invalid leap second, positive time-offset (wrong minute)",
            "invalid leap second, negative time-offset (wrong hour)",
            "invalid leap second, negative time-offset (wrong minute)",
            "an invalid time string with invalid leap second (wrong hour)",
            "an invalid time string with invalid leap second (wrong minute)",
        )
    },
    ("format/hostname", "exceeds maximum overall length (256)"): (
        "the 255-character total would multiply the label grammar's size"
    ),
    ("optional/ecmascript-regex", "zero-width whitespace does not match"): (
        "U+FEFF is white space to ECMA-262, not to Unicode: \\S matches it in Python's re "
        "(jsonschema's) and every backend"
    ),
}
_IDNA_PREFIXES = ("xn--", "XN--")  # every A-label case of format/hostname

# Groups whose outlines compile takes 8-65 s each (the regex index of open objects and
# arrays of "anything"; 2026-11-27: core/not#2, core/oneOf#7 and core/not#6 took 145 s of the
# outlines run's 171 s on the 2-core machine): skipped for outlines only, unless
# CONSTRAINED_FULL_SUITE=1 (no invalid instance accepted: the first twelve run 2026-11-21, the
# last three in every CI run until 2026-11-27). The other backends run every group.
SLOW_FOR_OUTLINES: set[str] = (
    set()
    if os.environ.get("CONSTRAINED_FULL_SUITE") == "1"
    else {
        "core/type#10", "core/type#9", "core/type#3", "core/type#4", "core/allOf#6",
        "core/anyOf#6", "core/required[typed]#0", "core/required[typed]#1",
        "core/required[typed]#2", "core/additionalProperties[typed]#4",
        "core/maxItems[typed]#0", "core/minItems[typed]#0",
        "core/not#2", "core/oneOf#7", "core/not#6",
    }
)  # fmt: skip


@dataclass
class Group:
    file: str  # "core/minLength", "format/date"...
    index: int
    description: str
    schema: Any
    tests: list[dict]

    @property
    def key(self) -> str:
        return f"{self.file}#{self.index}"


@dataclass
class Report:
    compiled: int = 0
    refused: int = 0
    instances: int = 0
    valid_rejected: int = 0
    invalid_accepted: list[str] = field(default_factory=list)
    known_gaps: int = 0


def load_groups() -> list[Group]:
    groups = []
    for prefix, folder in FOLDERS.items():
        for path in sorted((SUITE / folder).glob("*.json")):
            for index, group in enumerate(json.loads(path.read_text())):
                groups.append(
                    Group(f"{prefix}/{path.stem}", index, group["description"],
                          group["schema"], group["tests"])
                )  # fmt: skip
    return groups


def typed(group: Group) -> Group | None:
    """The group with the one ``type`` its root keywords imply, keeping that type's tests."""
    from constrained.schema.allow_list import TYPE_OF_KEYWORD

    schema = group.schema
    if not isinstance(schema, dict) or "type" in schema:
        return None
    kinds = {TYPE_OF_KEYWORD[k] for k in schema if k in TYPE_OF_KEYWORD}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    accepted = {kind, "integer"} if kind == "number" else {kind}
    tests = [t for t in group.tests if json_type(t["data"]) in accepted]
    if not tests:
        return None
    return Group(group.file + "[typed]", group.index, group.description,
                 {**schema, "type": kind}, tests)  # fmt: skip


def known_gap(group: Group, test: dict) -> bool:
    file = group.file.removesuffix("[typed]")
    if (file, test["description"]) in KNOWN_GAPS:
        return True
    data = test["data"]
    return file == "format/hostname" and isinstance(data, str) and data.startswith(_IDNA_PREFIXES)


def check(groups: list[Group], backend: str, vocab: Any, walker: Walker) -> Report:
    """Compile every group with ``backend`` and walk the instances of those compiled."""
    report = Report()
    for group in groups:
        if backend == "outlines" and group.key in SLOW_FOR_OUTLINES:
            continue
        try:
            compiled = compile_now(GrammarSpec("json_schema", json.dumps(group.schema), backend),
                                   vocab)  # fmt: skip
        except GrammarError:
            report.refused += 1
            continue
        report.compiled += 1
        for test in group.tests:
            report.instances += 1
            try:
                accepted = walker.accepts(compiled, test["data"])
            except UnicodeEncodeError:  # a lone surrogate: no text a model could write
                continue
            if accepted and not test["valid"]:
                if known_gap(group, test):
                    report.known_gaps += 1
                else:
                    report.invalid_accepted.append(f"{group.key} {test['description']!r}")
            report.valid_rejected += test["valid"] and not accepted
    return report


@pytest.fixture(scope="session")
def vocab(tiny_model_dir: str):
    from constrained.grammars import load_vocab

    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(scope="session")
def walker(vocab) -> Walker:
    return Walker(vocab)


@pytest.fixture(scope="session")
def groups() -> list[Group]:
    if not SUITE.is_dir():
        if os.environ.get("CI"):  # a skip is not a pass in CI
            pytest.fail(f"JSON-Schema-Test-Suite not found at {SUITE}")
        pytest.skip(f"JSON-Schema-Test-Suite not found at {SUITE}")
    return load_groups()


# Fewest schemas each configuration must compile (measured: a little below), so a change
# that makes a backend refuse everything cannot pass as "accepts nothing invalid".
# Measured 2026-11-25: auto 389, llguidance 376, xgrammar 208, outlines 95 (a margin for
# compiles that hit the time limit on a loaded machine).
# Measured (array checks in): auto 413, llguidance 402, xgrammar 230, outlines 95.
MIN_COMPILED = {"auto": 405, "llguidance": 395, "xgrammar": 220, "outlines": 90}


@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar", "outlines"])
def test_no_invalid_instance_is_accepted(backend, groups, vocab, walker, capsys):
    variants = [g for g in map(typed, groups) if g is not None]
    report = check(groups + variants, backend, vocab, walker)
    with capsys.disabled():
        print(f"\n{backend}: {report}")
    assert report.invalid_accepted == []
    assert report.compiled >= MIN_COMPILED[backend]
