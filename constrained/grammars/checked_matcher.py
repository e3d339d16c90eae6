"""A backend's matcher plus the array checks it cannot do: ``uniqueItems`` and ``contains``.

``CheckedGrammar`` wraps the grammar a backend compiled from the schema without those keywords
(``array_checks.plan_checks``); each ``CheckedMatcher`` follows its request's JSON text
(``json_scan``) and, after the backend fills a mask, clears the tokens that would break a
check:

- a token completing an item equal to an earlier item of a ``uniqueItems`` array;
- a token completing an item that would be one match too many for a ``maxContains``;
- a token closing an array with fewer ``contains`` matches than it needs (``minContains``,
  1 by default);
- look-aheads, so that breaking a check is not the only way on: over a finite item domain
  (an ``enum`` of plain scalars, bounded integers ...) a token leaving an item no value
  still allowed starts with, or a ``,`` when none is left; a literal repeating an item, at
  its first letter; a number repeating one where the backend lets it go no further; with
  llguidance, a token after which the bytes the grammar forces complete a repeat (or a
  match past ``maxContains``).

No dead ends, by construction: what an array still needs is counted against the room it
has. Over a finite item domain, a value is allowed only if the array can still be completed
after it (``CheckPlan.values_left``: unused values, matches still needed for ``minContains``
and items for ``minItems`` within ``maxItems``, none past ``maxContains``). Otherwise, when
the items left under ``maxItems`` equal the matches still needed, the next item must match:
from its first token only prefixes of matching items found ahead are allowed (values guessed
from the item's subschemas, ``sample_values``, each checked by consuming it and rolling
back), and an item that completes without matching is refused. Checks no array can meet are
refused when the grammar is compiled (``array_checks``); where the subschema allows other
values, the ``[`` that would open such an array is refused.

Cost, per step of a row inside a checked array (measured 60-150 µs on the 2-core CPU,
``benchmarks/array_checks.py``): the row's words ANDed with the tokens that can complete an
item or close or open an array there (``json_scan.TokenReach``), then each of those tokens
followed in Python (over a finite domain, every allowed token). Rows outside checked
arrays pay the AND for a ``[`` / ``]`` (an array opened or closed within one token).

If a row is left with no token anyway, that is a bug: the row the layers below wrote is
kept (the output still parses, though a check may break), ``stuck`` is set and an error
logged; end-of-sequence alone is never written for it (a ``stop`` is a complete, valid
output). ``forced`` steers witness walks (``closing.find_witness``) into ``contains``
matches. Look-aheads (a witness walk, a draft row) leave no trace once rolled back.

The parts, one request's each:

- ``checked_text.FollowedText``: the backend's matcher and the JSON text, followed in step
  (``ItemChecks``: what a completed item or a closing array must satisfy);
- ``checked_row.RowClearing``: a row's clearing (which tokens to follow, the repeats looked
  up by text);
- ``checked_lookahead.TokenLookahead``: one token's verdict (``allows``);
- ``checked_contains.ContainsSteering``: the items that match a ``contains`` still needed;
- ``CheckedMatcher`` (here): the ``Matcher`` interface, errors and ``stuck``.

Example::

    grammar = CheckedGrammar(compiled, plan, vocab)   # as auto.compile_with builds it
    matcher = grammar.matcher()
    matcher.consume(tokens)
    matcher.fill(bitmask, row)   # the backend's row, less what would break a check
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.checked_contains import ContainsSteering
from constrained.grammars.checked_lookahead import TokenLookahead
from constrained.grammars.checked_row import RowClearing
from constrained.grammars.checked_text import FollowedText
from constrained.grammars.finite_matcher import FiniteGrammar, with_finite_numbers
from constrained.grammars.matcher import Matcher, MatcherWrapper, fill_only
from constrained.schema.array_checks import CheckPlan, plan_checks
from constrained.schema.json_scan import Scan, TokenReach, token_reach

if TYPE_CHECKING:
    import torch

    from constrained.grammars.backend import CompiledGrammar
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)
STUCK = "no token keeps uniqueItems / contains (a dead end)"


def reach_of(vocab: Vocab) -> TokenReach:
    """The vocabulary's ``TokenReach``, built once."""
    return vocab._once("json_reach", lambda: token_reach(vocab.token_bytes()))


class CheckedGrammar:
    """A backend's compiled grammar (``inner``) and the checks its schema lost (``plan``)."""

    #: A row depends on the items seen (``uniqueItems``, ``contains``), not only on the
    #: grammar's state: requests do not share closing's checks (``backend.CompiledGrammar``).
    history = True

    def __init__(self, inner: CompiledGrammar, plan: CheckPlan, vocab: Vocab) -> None:
        self.inner = inner
        self.plan = plan
        self.vocab = vocab
        self.backend = inner.backend
        reach_of(vocab)  # built here, in a compile thread, not in the first mask fill

    def matcher(self) -> CheckedMatcher:
        return CheckedMatcher(self.inner.matcher(), self.plan, self.vocab)


def unwrapped(grammar: Any) -> Any:
    """The backend's own grammar (what the store keeps)."""
    while isinstance(grammar, (CheckedGrammar, FiniteGrammar)):
        grammar = grammar.inner
    return grammar


def with_checks(spec: GrammarSpec, grammar: Any, vocab: Vocab) -> Any:
    """``grammar`` (a backend's, loaded from the store) with the checks ``spec`` asks for, as
    ``auto.compile_with`` built it."""
    if spec.kind == "structural_tag":
        return with_finite_numbers(spec, grammar, vocab)
    if spec.kind != "json_schema":
        return grammar
    finite = FiniteGrammar(grammar, vocab)
    planned = plan_checks(spec.source, grammar.backend)
    return finite if planned is None else CheckedGrammar(finite, planned[1], vocab)


class CheckedMatcher(MatcherWrapper):
    """One request: the backend's matcher, the JSON text so far and the checks' state."""

    def __init__(self, inner: Matcher, plan: CheckPlan, vocab: Vocab) -> None:
        super().__init__(inner)
        self.plan = plan
        self.eos = vocab.eos_token_id
        reach = reach_of(vocab)
        self.followed = FollowedText(inner, plan, vocab)
        self.steering = ContainsSteering(self.followed, plan, reach)
        lookahead = TokenLookahead(self.followed, plan, reach, self.steering, vocab.width)
        self.clearing = RowClearing(self.followed, plan, reach, lookahead, self.steering)
        #: Set when the checks left a row no token (a bug: the look-aheads should keep every
        #: row open); the backend's own row was written instead, and an error logged.
        self.stuck = False

    @property
    def scan(self) -> Scan:
        """Where the JSON text stands (``json_scan.Scan``)."""
        return self.followed.scan

    @property
    def text(self) -> bytearray:
        """The JSON text the consumed tokens wrote."""
        return self.followed.text

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        if not self.inner.consume(tokens):
            self.error = self.inner.error or "token refused"
            return False
        for token in tokens:
            if self.error is None and not self.followed.advance(token):
                self.error = "a token broke uniqueItems / contains"
            if self.error is not None:  # one history entry per token the backend took
                self.followed.hold()
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        if self.error is not None:
            return 0
        return self.followed.try_consume(tokens)

    def rollback(self, num_tokens: int) -> None:
        self.followed.rollback(num_tokens)

    def forced(self) -> list[int]:
        """The backend's forced tokens; inside a checked array that still needs ``contains``
        matches, at an item's start, the tokens of an item that matches (consumable: checked
        when found). ``closing.find_witness`` takes them first, so a witness walk meets
        ``minContains`` instead of writing the shortest items until ``maxItems``; a model is
        never made to write them (the masks allow every item that keeps the array
        completable)."""
        if self.error is not None:
            return []
        steering = self.steering.forced()
        if steering:
            return steering
        return self.inner.forced()

    def forced_bytes(self) -> bytes | None:
        return self.inner.forced_bytes() if self.error is None else b""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        self.inner.fill(bitmask, row)  # the layers below, their own clearing included
        self._narrow_own(bitmask, row)

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear, in a row the layers below wrote, the tokens that would break a check or
        leave the array no way to meet it (``RowClearing``)."""
        if self.error is not None:
            fill_only(bitmask, row, [self.eos])
            return
        words = bitmask[row].numpy().view(np.uint32)
        backend_row = words.copy()
        self.clearing.clear(words)
        if not words.any():  # a bug: the look-aheads let the array reach a dead end
            words[:] = backend_row  # the output still parses; a check may break
            self.stuck = True
            logger.error(
                "constrained: %s after %r; writing the backend's row without the array checks",
                STUCK,
                bytes(self.text[-64:]),
            )
