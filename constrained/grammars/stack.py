"""A request's grammar row as a stack of matchers (``matcher.py`` states the contract).

Built once, when the request joins the engine, from the compiled grammar (whose
``matcher()`` is the backend's matcher, with the array checks already over it where the
schema has them: ``checked_matcher.CheckedGrammar``) and the request's budget. Bottom to top:

1. the backend's matcher (llguidance, xgrammar, outlines-core);
2. ``CheckedMatcher``: ``uniqueItems`` / ``contains`` (JSON schemas that use them);
3. ``ClosingMatcher``: every output complete by ``max_tokens`` (``close_at_max_tokens``).

A new rule on grammar rows is one more ``MatcherWrapper`` placed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.grammars.closing import root_witness
from constrained.grammars.closing_matcher import ClosingMatcher

if TYPE_CHECKING:
    import torch

    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab


def build_stack(
    compiled: Any,
    vocab: Vocab,
    limit: int | None,
    hints: Sequence[list[int]] = (),
    scratch: torch.Tensor | None = None,
) -> Matcher:
    """The stack for one request: ``limit`` is its ``max_tokens`` when it closes by them;
    ``hints``: completions a preempted request's earlier stack knew (checked before use);
    ``scratch``: a host bitmask row for closing's walks."""
    matcher = compiled.matcher()
    if limit is None:
        return matcher
    root = root_witness(compiled, vocab, scratch)  # walked once per grammar, for every request
    hints = [*hints, root] if root is not None else hints
    return ClosingMatcher(matcher, vocab, limit, hints, scratch)
