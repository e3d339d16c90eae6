"""Rows within reach (``closing_matcher.py``): the tokens after which no completion fits,
cleared from a narrow row, by the ``Checker``.

A row within ``reach`` of the budget but not within ``grow`` is left as the layers below
wrote it but for its risers: in a narrow row (a key, a value's first token: where one token
can open a long value), the tokens whose known suffix completes but is too long, or whose
walk finds no completion in ``RISER_WALK_TOKENS`` masks a row; a token left unchecked stays,
and the row never loses all its tokens. A wide row (text) is left as it is. A row that
allows the same tokens with the same witness as the request's last such row (a number's
digits) takes that row's checks again (``Risers.again``).

Example::

    risers = Risers(checker)
    safe = risers.narrow(words, witness, left, committed=True)   # the suffixes found
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from constrained.grammars.closing import completes
from constrained.grammars.closing_check import WALK_TOKENS, Walks
from constrained.grammars.closing_row_sort import EXACT_MAX, only_the_witness, others
from constrained.grammars.matcher import row_ids

if TYPE_CHECKING:
    from constrained.grammars.closing_check import Checker

RISER_WALK_TOKENS = 4 * WALK_TOKENS  # the walk budget of a narrow row within reach (a key
# row: its prefixes' walks fail first)


class RiserRow(NamedTuple):
    """A riser row's checks, kept for the request's next row: its words as they left it,
    the tokens they cleared, its witness and the suffixes found."""

    after: np.ndarray
    cleared: np.ndarray
    witness: list[int]
    safe: dict[int, list[int]]

    @property
    def before(self) -> np.ndarray:
        """The row's words as the layers below wrote them."""
        if not self.cleared.size:
            return self.after
        words = self.after.copy()
        np.bitwise_or.at(
            words, self.cleared // 32, np.uint32(1) << (self.cleared % 32).astype(np.uint32)
        )
        return words


_NONE = np.zeros(0, dtype=np.int64)


class Risers:
    """A request's rows within reach, checked with ``checker``; ``last``: the last committed
    narrow one's checks (``None`` after a rollback of committed tokens)."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.vocab = checker.vocab
        self.eos = checker.vocab.eos_token_id
        self.last: RiserRow | None = None

    def narrow(
        self, words: np.ndarray, witness: list[int], left: int, committed: bool
    ) -> dict[int, list[int]] | None:
        """A row within reach narrowed (``words``, in place): at a committed state, the last
        riser row's checks where this row is like it (``again``), else its own, kept for the
        next row. The suffixes found (``None``: no check made, a wide row)."""
        if committed:
            found = self.again(words, witness, left)
            if found is not None:
                return found
        found, cleared = self._checked(words, witness, left)
        if committed:
            self.last = None if found is None else RiserRow(words.copy(), cleared, witness, found)
        return found

    def clear(
        self, words: np.ndarray, witness: list[int], left: int
    ) -> dict[int, list[int]] | None:
        """A row within reach checked afresh (``words`` narrowed in place): the suffixes
        found, ``None`` where no check was made (a wide row)."""
        return self._checked(words, witness, left)[0]

    def again(
        self, words: np.ndarray, witness: list[int], left: int
    ) -> dict[int, list[int]] | None:
        """The last riser row's checks for this row, where it allows the same tokens with
        the same witness (a number's digits, one row after another): each suffix found there
        checked again here (one ``completes``: equal rows and witnesses need not be equal
        states) and within the room, the tokens it cleared cleared again. ``None`` where the
        row differs or a suffix fails (the row is checked afresh).

        The cleared tokens are not checked again, as ``RowSorter.sorted_again`` does not:
        with the room one less, none of them completes by a suffix its check tried at an
        equal state; at a state only equal-looking one might, and stays cleared (a
        distortion, never a cut). Measured: a pass of 30 tool calls replayed and
        ``closing_digest`` over 120 MaskBench schemas, every row as before."""
        last = self.last
        if last is None or last.witness != witness or not np.array_equal(last.before, words):
            return None
        room, inner = left - 2, self.checker.inner
        for token, suffix in last.safe.items():
            if len(suffix) > room or not completes(inner, [token, *suffix]):
                return None
        words[:] = last.after
        return dict(last.safe)

    def _checked(
        self, words: np.ndarray, witness: list[int], left: int
    ) -> tuple[dict[int, list[int]] | None, np.ndarray]:
        """The row's checks (``None`` for a wide row) and the token ids they cleared."""
        count = others(words, self.eos)  # (one pass over the row for both tests)
        if count > EXACT_MAX:  # wide
            return None, _NONE
        only = only_the_witness(words, witness, self.eos, count)
        if only is not None:  # (a fifth of the riser rows, for nothing)
            return only, _NONE
        ids = row_ids(words)
        ids = ids[(ids != self.eos) & (ids < self.vocab.width)]
        if ids.size > EXACT_MAX:
            return None, _NONE
        safe: dict[int, list[int]] = {}
        walks, risers = Walks(why=True, left=RISER_WALK_TOKENS), []
        tokens = ids.tolist()
        checker = self.checker
        pieces, spelling = self.vocab.token_bytes(), checker.spelling
        by_bytes = checker.inner.reads_bytes
        for token in tokens:
            known = spelling.aligned_bytes(pieces[token], witness) if by_bytes else None
            if known is not None and len(known) <= left - 2:
                # it writes the witness's first bytes: their rest, in time, as a check finds it
                checker.record(token, known, witness, safe)
                continue
            if checker.check(token, witness, left, safe, walks) is None and walks.no_end:
                risers.append(token)
        if not risers or len(risers) == len(tokens):
            return safe, _NONE
        cleared = np.asarray(risers, dtype=np.int64)
        np.bitwise_and.at(words, cleared // 32, ~(np.uint32(1) << (cleared % 32).astype(np.uint32)))
        return safe, cleared
