"""Uniform random walks through a grammar row with and without closing (#27): the model
replaced by uniform choices among the tokens a row allows. Used by
``tests/test_closing_walks.py`` and ``benchmarks/closing_walks.py`` (which describes the
measures: outputs complete by ``max_tokens``, rows compared along the same walk, total
variation by importance weights).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Walk:
    """One walk: its tokens (end-of-sequence not included) and how it ended: ``eos``, ``cut``
    (``max_tokens`` or the cap reached), ``stuck`` (an empty row), ``refused`` (a token its
    own row allowed was refused), ``stale`` (closing's witness does not complete from
    where the output is: a check made at another state)."""

    tokens: list[int]
    ended: str
    warned: bool = False


@dataclass
class Rows:
    """Rows compared along replayed walks at one budget."""

    budget: int = 0
    verify_max: int = 1 << 30  # cleared tokens verified at most (a witness walk each)
    walks: int = 0
    rows: int = 0
    differing: int = 0
    cleared: int = 0
    verified: int = 0
    needless: int = 0
    added: int = 0  # tokens a closing row allowed that the row without closing did not
    left_support: int = 0  # walks with a token the closing row did not allow
    tv_terms: list[float] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)  # needless clears, the first few

    def summary(self) -> dict:
        n = len(self.tv_terms)
        mean = sum(self.tv_terms) / n if n else 0.0
        var = sum((t - mean) ** 2 for t in self.tv_terms) / (n - 1) if n > 1 else 0.0
        return {"budget": self.budget, "walks": self.walks, "rows": self.rows,
                "differing": self.differing, "cleared": self.cleared,
                "verified": self.verified, "needless": self.needless, "added": self.added,
                "left_support": self.left_support, "tv": round(mean, 6),
                "tv_stderr": round(math.sqrt(var / n), 6) if n else 0.0}  # fmt: skip


def closing_stack(compiled: Any, vocab: Any, limit: int) -> Any:
    """A row's stack with closing on at ``max_tokens = limit``, as ``stack.build_stack``
    builds it for a JSON-schema request that does not think first (``closing_layer``: the
    compiled grammar's matcher, its array checks included, under ``ClosingMatcher``)."""
    from constrained.grammars.closing_matcher import closing_layer

    return closing_layer(compiled, vocab, limit, json=True)


def allowed(matcher: Any, bitmask: Any, row: int, width: int) -> Any:
    from constrained.grammars.closing import allowed_ids

    matcher.fill(bitmask, row)
    return allowed_ids(bitmask[row], width).nonzero()[0]


def walk(matcher: Any, vocab: Any, bitmask: Any, rng: random.Random, budget: int) -> Walk:
    """Uniform choices among the allowed tokens, at most ``budget`` tokens (end included)."""
    tokens: list[int] = []
    eos = vocab.eos_token_id
    from constrained.grammars.closing import completes

    while len(tokens) < budget:
        ids = allowed(matcher, bitmask, 0, vocab.width)
        witness = getattr(matcher, "witness", None)  # closing's, where the stack has one
        if witness is not None and not completes(matcher.inner, witness):
            return Walk(tokens, "stale", bool(matcher.warned))
        if not ids.size:
            return Walk(tokens, "stuck", bool(getattr(matcher, "warned", False)))
        token = int(ids[rng.randrange(ids.size)])
        if token == eos:
            return Walk(tokens, "eos", bool(getattr(matcher, "warned", False)))
        if not matcher.consume([token]):
            return Walk(tokens, "refused", bool(getattr(matcher, "warned", False)))
        tokens.append(token)
    return Walk(tokens, "cut", bool(getattr(matcher, "warned", False)))


def judge(tokens: list[int], vocab: Any, schema: Any) -> str:
    """``valid``, ``format_invalid`` (valid but for a format), ``invalid`` or ``unchecked``
    (the validator cannot read the schema)."""
    from jsonschema import Draft202012Validator, validators

    pieces = vocab.token_bytes()
    try:
        value = json.loads(b"".join(pieces[t] for t in tokens))
    except ValueError:
        return "invalid"
    try:
        cls = validators.validator_for(schema, default=Draft202012Validator)
        if not cls(schema).is_valid(value):
            return "invalid"
        checked = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return "valid" if checked.is_valid(value) else "format_invalid"
    except Exception:  # an unresolvable $ref, an unknown draft
        return "unchecked"


def replay(compiled: Any, vocab: Any, bitmask: Any, tokens: list[int], ended: str,
           budget: int, rows: Rows, verify: int, rng: random.Random) -> None:  # fmt: skip
    """A closing-off walk's first ``budget`` tokens through closing on and off at once:
    rows compared, cleared tokens checked for a completion in reach, the TV term."""
    import numpy as np

    from constrained.grammars.closing import find_witness

    eos = vocab.eos_token_id
    on, off = closing_stack(compiled, vocab, budget), compiled.matcher()
    path = tokens[:budget]
    if len(path) < budget and ended == "eos":
        path = [*path, eos]  # the output's end, a choice of the last row
    log_ratio, weight_zero = 0.0, False
    rows.walks += 1
    for step, token in enumerate(path):
        free = allowed(off, bitmask, 0, vocab.width)
        kept = allowed(on, bitmask, 1, vocab.width)
        rows.rows += 1
        if free.size != kept.size or not np.array_equal(free, kept):
            rows.differing += 1
            cleared = np.setdiff1d(free, kept, assume_unique=True).tolist()
            rows.cleared += len(cleared)
            rows.added += int(np.setdiff1d(kept, free, assume_unique=True).size)
            room = budget - step - 2  # tokens a completion may take after the cleared one
            for cut in rng.sample(cleared, min(verify, len(cleared))):
                if cut == eos or rows.verified >= rows.verify_max:
                    continue
                rows.verified += 1
                taken = off.try_consume([cut])
                try:
                    found = find_witness(off, vocab, room) if taken and room >= 0 else None
                    if found is not None:
                        rows.needless += 1
                        if len(rows.examples) < 5:
                            text = vocab.token_bytes()[cut].decode(errors="replace")
                            rows.examples.append({
                                "budget": budget, "step": step, "row": int(free.size),
                                "kept": int(kept.size), "token": text,
                                "completion_tokens": len(found)})  # fmt: skip
                finally:
                    off.rollback(taken)
        at = int(np.searchsorted(kept, token))
        if at == kept.size or kept[at] != token:
            weight_zero = True
            rows.left_support += 1
            break
        log_ratio += math.log(free.size) - math.log(kept.size)
        if token == eos:
            break
        if not (on.consume([token]) and off.consume([token])):
            raise AssertionError(f"a token both rows allowed was refused: {on.error}")
    ratio = 0.0 if weight_zero else math.exp(min(log_ratio, 50.0))
    rows.tv_terms.append(max(0.0, 1.0 - ratio))
