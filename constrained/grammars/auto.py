"""Which backend compiles a spec: the one asked for, or for ``auto`` the first that enforces it.

A backend compiles a JSON schema only when its ``refusal`` finds nothing it would not
enforce. ``auto`` tries ``registry.BACKENDS`` in order and takes the first that compiles; when
none does, the first backend's reason leads (llguidance enforces the most) and the error names
the keyword no backend enforces (for a structural tag, the keyword a backend that compiles its
parts named, with that backend's reason alone).
"""

from __future__ import annotations

import dataclasses
import json

from constrained.errors import GrammarError
from constrained.grammars.backend import CompiledGrammar
from constrained.grammars.checked_matcher import CheckedGrammar
from constrained.grammars.finite_matcher import FiniteGrammar, with_finite_numbers
from constrained.grammars.registry import BACKENDS, get_backend
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.vocab import Vocab
from constrained.schema.array_checks import plan_checks
from constrained.schema.rewrite import first_enforced


def compile_with(name: str, spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    """Compile with the backend called ``name``, unless it would not enforce the schema.

    A JSON schema the backend refuses as written is tried once more rewritten
    (``schema_rewrite``: the same instances, in keywords backends enforce). ``uniqueItems``
    and ``contains`` are taken out first and checked by the matcher (``array_checks``,
    ``checked_matcher``); numbers are kept finite (``finite_matcher``).

    Raises:
        GrammarError: the backend refuses the constraint, or it does not compile; the
            reason given is the one for the schema as written.
    """
    if spec.kind == "structural_tag":
        return with_finite_numbers(spec, _compile_as_written(name, spec, vocab), vocab)
    if spec.kind != "json_schema":
        return _compile_as_written(name, spec, vocab)
    planned = plan_checks(spec.source, name)
    source = spec.source if planned is None else planned[0]
    compiled = first_enforced(
        source,
        lambda source: _compile_as_written(name, dataclasses.replace(spec, source=source), vocab),
    )
    finite = FiniteGrammar(compiled, vocab)
    return finite if planned is None else CheckedGrammar(finite, planned[1], vocab)


def _compile_as_written(name: str, spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    backend = get_backend(name)
    if spec.kind not in backend.kinds:
        kinds = " and ".join(sorted(backend.kinds))
        raise GrammarError(name, f"compiles {kinds}, not {spec.kind}")
    if spec.kind == "json_schema":
        backend.refuse_unenforced(json.loads(spec.source))
    return backend.compile(spec, vocab)


def compile_auto(spec: GrammarSpec, vocab: Vocab) -> CompiledGrammar:
    """Compile with the first backend, in ``auto`` order, that compiles ``spec``.

    Raises:
        GrammarError: no backend does; its message joins every backend's reason.
    """
    errors: list[GrammarError] = []
    for backend in BACKENDS:
        if spec.kind not in backend.kinds:
            continue
        try:
            return compile_with(backend.name, spec, vocab)
        except GrammarError as exc:
            errors.append(exc)
    reasons = "; ".join(str(e) for e in errors)
    first = errors[0]
    if spec.kind == "json_schema":
        keyword = BACKENDS[0].refused_keyword(first)
        if keyword is not None:
            raise GrammarError(
                "",
                f"keyword '{keyword}' is not enforced by any backend ({reasons})",
                keyword=keyword,
            )
    named = [e for e in errors if e.keyword is not None]
    if spec.kind == "structural_tag" and named:  # the others refused a part, not a keyword
        keyword = named[0].keyword
        reasons = "; ".join(str(e) for e in named)
        raise GrammarError(
            "", f"keyword '{keyword}' is not enforced by the backends that compile it ({reasons})",
            keyword=keyword,
        )  # fmt: skip
    raise GrammarError("", f"cannot be compiled ({reasons})")
