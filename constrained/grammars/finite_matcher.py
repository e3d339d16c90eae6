"""A JSON schema's matcher that never writes a number a double cannot hold (``1e999``).

``FiniteGrammar`` wraps the backend's compiled grammar of every JSON schema (``auto``
builds it; below the array checks, if any); each ``FiniteMatcher`` follows its request's
numbers (``schema.finite_numbers``) and, after the backend fills a row, clears the tokens
that would make the number being written read as infinite. The backends' JSON grammars
allow any number of digits; the rule and why it leads to no dead end are in
``finite_numbers``.

Cost: one lookup per consumed token outside numbers and strings' ends, a few bytes
followed otherwise; a row is checked token by token only inside a number long enough to
come near a double's range (``may_break``), or when the row allows one of the vocabulary's
rare tokens that could break the rule alone.

Closing's tables stay shared between requests (``history`` is the grammar's below): this
layer only clears tokens, before closing narrows, and a shortest completion never grows a
number.

Example::

    grammar = FiniteGrammar(compiled, vocab)   # as auto.compile_with builds it
    matcher = grammar.matcher()
    matcher.consume(tokens)                    # ... '{"x": 1e99'
    matcher.fill(bitmask, row)                 # the backend's row, less '9' (1e999)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.marker import text_pieces
from constrained.grammars.matcher import MatcherWrapper, fill_only, row_ids
from constrained.grammars.structural_tag import json_openers
from constrained.grammars.token_shapes import piece_arrays
from constrained.schema.finite_numbers import (
    FREE,
    FREE_START,
    NUMBER,
    OUT,
    START,
    STRING,
    NumberState,
    NumberTokens,
    advance,
    may_break,
    number_tokens,
)

if TYPE_CHECKING:
    import torch

    from constrained.grammars.matcher import Matcher
    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)
BROKEN = "a number a double cannot hold (it would read as infinite)"
# A grammar's memos hold at most this many entries each, then start again (the states in
# use now): bounded memory for a long-lived grammar (~0.5 MB each), and closing's checks
# meet the same few states within a step
STEPS_KEPT = 2048


def tokens_of(vocab: Vocab, tagged: bool = False) -> NumberTokens:
    """The vocabulary's ``NumberTokens``, built once. ``tagged``: for a structural tag, whose
    literals may be special tokens (``<tool_call>``): those spelled as their text."""
    if not tagged:
        return vocab._once(
            "finite_numbers", lambda: number_tokens(vocab.token_bytes(), piece_arrays(vocab))
        )
    return vocab._once("finite_numbers_tagged", lambda: number_tokens(text_pieces(vocab)))


def free_keeps(vocab: Vocab, opens: tuple[bytes, ...]) -> list[bool]:
    """Per token: it leaves a tag's free text with no ``begin`` under way as it is (none of
    its bytes starts a ``begin``), built once per vocabulary and set of first bytes."""
    firsts = frozenset(begin[0] for begin in opens if begin)
    pieces = tokens_of(vocab, tagged=True).pieces
    key = "finite_free_" + bytes(sorted(firsts)).hex()
    return vocab._once(key, lambda: [firsts.isdisjoint(piece) for piece in pieces])


def _kept_in(memo: dict, key: Any, value: Any) -> Any:
    """``value``, kept in one of a grammar's memos under ``key`` (a full memo starts again)."""
    if len(memo) >= STEPS_KEPT:
        memo.clear()
    memo[key] = value
    return value


def _keeps(table: NumberTokens, state: NumberState, free: list[bool] | None) -> list[bool] | None:
    """Which tokens leave ``state`` as it is (``None``: look at each token's bytes);
    ``free``: a structural tag's ``free_keeps`` (``None``: one JSON document)."""
    if state.mode == OUT:
        return table.keeps_out if free is None else table.keeps_tagged_out
    if state.mode == STRING:
        return table.keeps_string
    return free if state.mode == FREE and not state.tail else None


class FiniteGrammar:
    """A backend's compiled JSON-schema grammar (``inner``) whose numbers stay finite."""

    def __init__(self, inner: Any, vocab: Vocab, opens: tuple[bytes, ...] = ()) -> None:
        self.inner = inner
        self.vocab = vocab
        self.opens = opens  # a structural tag's JSON parts' begins (empty: one document)
        self.backend = inner.backend
        self.history = getattr(inner, "history", False)
        # built here, in a compile thread, not at a mask fill
        self.tokens = tokens_of(vocab, bool(opens))
        self.free = free_keeps(vocab, opens) if opens else None
        #: ``advance`` of a token from a state, for every matcher of this grammar: closing's
        #: checks walk the same few states and tokens again and again
        self.steps: dict[tuple[NumberState, int], tuple[NumberState, bool]] = {}
        #: whether every token of a run from a state keeps the rule (``completes``)
        self.runs: dict[tuple[NumberState, tuple[int, ...]], bool] = {}

    def matcher(self) -> FiniteMatcher:
        return FiniteMatcher(self.inner.matcher(), self)


def with_finite_numbers(spec: GrammarSpec, grammar: Any, vocab: Vocab) -> Any:
    """A structural tag's compiled ``grammar`` with the rule in its JSON parts (as it is when
    none has a JSON value)."""
    opens = json_openers(spec.source)
    return FiniteGrammar(grammar, vocab, opens) if opens else grammar


class FiniteMatcher(MatcherWrapper):
    """One request: the backend's matcher and where its JSON text's numbers stand."""

    def __init__(self, inner: Matcher, grammar: FiniteGrammar) -> None:
        super().__init__(inner)
        self.grammar = grammar  # its tables, begins and memos
        #: the state after each consumed token
        self.states: list[NumberState] = [FREE_START if grammar.opens else START]

    def _kept(self, tokens: Sequence[int], count: int) -> int:
        """How many of the first ``count`` of ``tokens``, in order, keep every number finite
        from here; their states are appended to ``states``."""
        grammar, states = self.grammar, self.states
        table, steps, free = grammar.tokens, grammar.steps, grammar.free
        state = states[-1]
        # most tokens leave the state as it was, known without a look at their bytes
        keeps = _keeps(table, state, free)
        for taken in range(count):
            token = tokens[taken]
            if keeps is not None and (token >= len(keeps) or keeps[token]):
                states.append(state)
                continue
            step = steps.get((state, token))
            if step is None:
                step = _kept_in(
                    steps, (state, token), advance(state, table.pieces[token], grammar.opens)
                )
            state, ok = step
            if not ok:
                return taken
            states.append(state)
            keeps = _keeps(table, state, free)
        return count

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        if not self.inner.consume(tokens):
            self.error = self.inner.error or "token refused"
            return False
        kept = self._kept(tokens, len(tokens))
        if kept < len(tokens):
            self.error = BROKEN
            self.states.extend([self.states[-1]] * (len(tokens) - kept))  # one per token
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        if self._error is not None:  # (the layers below answer 0 for their own)
            return 0
        taken = self.inner.try_consume(tokens)
        if not taken:
            return 0
        kept = self._kept(tokens, taken)
        if kept < taken:
            self.inner.rollback(taken - kept)
        return kept

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        if num_tokens:
            del self.states[-num_tokens:]

    def completes(self, tokens: Sequence[int]) -> bool:
        if self.error is not None:
            return False
        # The backend first: most of closing's tries fail there (a suffix that does not
        # follow the token), and the rule is read only for those it accepts.
        if not self.inner.completes(tokens):
            return False
        # Closing checks a row's tokens each with the same few suffixes, and most tokens
        # leave the same state: a run is memoised from the state after its first token.
        tokens = list(tokens)
        before = len(self.states)
        try:
            if tokens and not self._kept(tokens, 1):
                return False
            runs, rest = self.grammar.runs, tuple(tokens[1:])
            key = (self.states[-1], rest)
            whole = runs.get(key)
            if whole is None:
                whole = _kept_in(runs, key, self._kept(rest, len(rest)) == len(rest))
            return whole
        finally:
            del self.states[before:]

    def accepted(self, tokens: Sequence[int]) -> int:
        if self.error is not None:
            return 0
        kept = self._kept(tokens, len(tokens))
        del self.states[len(self.states) - kept :]
        return self.inner.accepted(list(tokens)[:kept]) if kept else 0

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear the tokens after which the number being written would read as infinite."""
        grammar = self.grammar
        if self.error is not None:
            fill_only(bitmask, row, [grammar.vocab.eos_token_id])
            return
        state, tokens = self.states[-1], grammar.tokens
        if state.mode != NUMBER and not tokens.risky:
            return  # (the common case: nothing here can break the rule)
        check = list(tokens.risky)
        if may_break(state, tokens.most_digits):
            words = bitmask[row].numpy().view(np.uint32)
            width = len(tokens.continues)
            check += row_ids(words[:width] & tokens.continues).tolist()
        if not check:
            return
        words = bitmask[row].numpy().view(np.uint32)
        before = words.copy()
        opens = grammar.opens
        for token in check:
            bit = np.uint32(1 << (token % 32))
            if words[token // 32] & bit and not advance(state, tokens.pieces[token], opens)[1]:
                words[token // 32] &= ~bit
        if not words.any():  # cannot happen (finite_numbers): keep the output parsing
            words[:] = before
            logger.error("constrained: %s: no token left after %r", BROKEN, state.number)
