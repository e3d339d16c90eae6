"""One token's check near the budget (``closing_matcher.py``): the suffix that completes the
output after it in time, a known one first, else a walk.

A check is one ``completes`` of the matcher per suffix tried (llguidance: about 2 us); a walk
costs a mask per token, so what earlier checks found (``SuffixMemory``) is tried first. The
guarantee rests on the matcher's own checks: a suffix is kept only where the matcher consumed
the token and the suffix and accepts the end, or, for the witness's own first token, the
witness's rest (the witness was so checked). A riser row (``closing_risers.Risers``) also
keeps, unchecked, the rest of the witness's text after a token that writes its first bytes,
where the stack reads bytes (``Matcher.reads_bytes``).

Example::

    checker = Checker(matcher, vocab, Horizon(8, 8), SuffixMemory(vocab), Spelling(vocab))
    suffix = checker.check(token, witness, left, safe, Walks())  # None: no end in time
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from constrained.grammars.closing import completes, find_witness, literal_tokens
from constrained.grammars.closing_spelling import masks_taken
from constrained.grammars.matcher import words_for
from constrained.grammars.token_shapes import SEAM_FREE, seam_fits, utf8_seams

if TYPE_CHECKING:
    import torch

    from constrained.grammars.closing_memory import SuffixMemory
    from constrained.grammars.closing_spelling import Spelling
    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab

WALK_TOKENS = 96  # walk budget per narrowed row, for tokens no known suffix completes after
# (charged a found walk's spelt length, a failed one's room: masks run to about twice it)


@dataclass
class Horizon:
    """How far from the budget closing looks: ``grow`` bounds how much one token raises the
    need (tokens), ``reach`` the same counted in bytes (one token can open text written a
    token per byte: a date-time's digits); both only rise, as checks find longer suffixes."""

    grow: int
    reach: int

    def saw(self, rise: int) -> None:
        """A check found a suffix ``rise`` tokens longer than the witness's."""
        self.grow = max(self.grow, rise)
        self.reach = max(self.reach, self.grow)


class Walks:
    """What one row may still walk: ``left`` masks (``WALK_TOKENS``), the classes where
    a walk after a member found nothing in reach (their other members are not walked: a
    UTF-8 lead byte fails as its neighbours do), and whether the last check found its
    token cannot end in time (``no_end``: a known suffix completes but is too long, or its
    walk found nothing; not a check cut short by the walk budget)."""

    def __init__(self, why: bool = False, left: int = WALK_TOKENS) -> None:
        self.left = left
        self.failed: set[int] = set()
        self.no_end = False
        self.why = why  # whether a failed check must say if it was ``no_end`` (risers)


class Checker:
    """Checks tokens of a request's rows against the stack below closing (``inner``)."""

    def __init__(
        self,
        inner: Matcher,
        vocab: Vocab,
        horizon: Horizon,
        memory: SuffixMemory,
        spelling: Spelling,
        scratch: torch.Tensor | None = None,
        json: bool = False,
    ) -> None:
        self.inner = inner
        self.vocab = vocab
        self.horizon = horizon
        self.memory = memory
        self.spelling = spelling
        self._scratch = scratch  # a host bitmask row for walks (the writer's: one per engine)
        # A JSON schema's grammar, where JSON's literals (``true``, ``null``) are shortcuts
        # everywhere: a walk that only looks for more (a check's, a shorter witness's) is
        # not walked again without them (``walk``).
        self.json = json
        # JSON is UTF-8 text: a suffix that cannot meet its token as UTF-8 is refused there
        # (a Lark grammar's ``~`` may match invalid UTF-8: other grammars try every suffix)
        self.seams = utf8_seams(vocab) if json else None

    def row(self) -> torch.Tensor:
        """The host bitmask row walks fill (made at the first walk if none was given)."""
        if self._scratch is None:
            import torch

            self._scratch = torch.zeros(1, words_for(self.vocab.width), dtype=torch.int32)
        return self._scratch

    def walk(
        self, limit: int, joins: Sequence[list[int]] = (), looking: bool = False
    ) -> list[int] | None:
        """A completion from the current state within ``limit`` (``find_witness``), ending
        early where one of ``joins`` completes. ``looking``: a walk for more than the row
        needs (a check's, a shorter witness's), walked once in a JSON schema's grammar and
        wherever the first walk finds nothing."""
        # Joins only end a walk early: the same walk without them finds nothing more.
        found = find_witness(self.inner, self.vocab, limit, self.row(), joins=joins)
        if looking and (self.json or found is None):
            # In JSON the second walk found a shorter completion for 1 walk of 236; where
            # the first found none, in a pass of 30 tool calls, it found one for none of 162.
            return found
        literals = literal_tokens(self.vocab)
        # Outside JSON, JSON's literals (``true``, ``null``) are no shortcut: walk without.
        if found is None or any(literals[token] for token in found):
            other = find_witness(self.inner, self.vocab, limit, self._scratch, plain_text=True)
            if other is not None and (found is None or len(other) < len(found)):
                return other
        return found

    def walk_after(self, token: int, room: int) -> list[int] | None:
        """A completion after ``token`` within ``room`` (``find_witness``), or ``None``."""
        if self.inner.try_consume([token]) != 1:
            return None
        try:
            return find_witness(self.inner, self.vocab, room, self.row())
        finally:
            self.inner.rollback(1)

    def forced_check(self, token: int, left: int, safe: dict[int, list[int]]) -> bool | None:
        """Whether what the grammar forces after ``token`` completes the output in time (an
        enum value's first token: the rest of the value is forced); recorded in ``safe``.
        ``None``: the token is refused, or its forced rest alone is too long."""
        if self.inner.try_consume([token]) != 1:
            return None
        try:
            rest = self.inner.forced()
            if len(rest) > left - 2:
                return None  # a walk cannot help either
            done = completes(self.inner, rest)
        finally:
            self.inner.rollback(1)
        if done:
            safe[token] = list(rest)
        return done

    def check(
        self,
        token: int,
        witness: list[int],
        left: int,
        safe: dict[int, list[int]],
        walks: Walks,
        key: int | None = None,
    ) -> list[int] | None:
        """The suffix that completes after ``token`` in time (recorded in ``safe``): the
        witness or its tail, nothing, the witness's text after the token's, the last suffix
        found for it or a token of its class (``key``; this row or an earlier one), the last
        few found for any (``learnt``), else a walk. A known suffix that completes but is
        too long ends the check without a walk: the walks found those suffixes, and a walk
        from here would most likely find no shorter one (failed walks are most of a tight
        row's cost)."""
        room = left - 2
        walks.no_end = False
        if room < 0:
            return None
        if room == 0:  # the token must end the output itself: no suffix fits, none to walk
            if not completes(self.inner, [token]):
                return None
            return self._found(token, [], witness, safe, key, False)
        if witness and token == witness[0] and len(witness) - 1 <= room:
            # The witness completes from here (checked when it was found, followed since):
            # its first token's suffix is its rest, without consuming it all again.
            return self._found(token, witness[1:], witness, safe, key, False)
        longer = []  # known suffixes too long for the room: tried only where it matters
        kinds, continues = self.seams or (None, None)
        kind = int(kinds[token]) if kinds is not None else SEAM_FREE
        for suffix, learnt in self._tries(token, witness, key):
            if len(suffix) <= room:
                if not seam_fits(kind, continues, suffix):
                    continue  # not UTF-8 where they meet
                if completes(self.inner, [token, *suffix]):
                    return self._found(token, suffix, witness, safe, key, learnt)
            else:
                longer.append(suffix)
        # No slack (the witness's rest takes the whole room): a completion after another
        # token must be as short as the witness's own, which the known suffixes above
        # already try (its siblings, its aligned text); in a wide row (a class ``key``)
        # walks there almost never find one, and were most of a tight row's cost. A narrow
        # row's few tokens are walked (``":{"`` after a key, where the witness is ``":``
        # ``{`` ``"``...: its own text in fewer tokens).
        slack = room >= len(witness) or key is None
        walk = walks.left > 0 and key not in walks.failed and slack
        if not walk and not walks.why:  # a sort: an unchecked token is cleared either way
            return None
        too_long = any(completes(self.inner, [token, *suffix]) for suffix in longer)
        if too_long or not walk:
            walks.no_end = too_long
            return None
        return self._walked(token, witness, room, safe, walks, key)

    def _walked(
        self,
        token: int,
        witness: list[int],
        room: int,
        safe: dict[int, list[int]],
        walks: Walks,
        key: int | None,
    ) -> list[int] | None:
        """``check``'s last resort: a walk from after ``token``, ending where the witness
        (or one of its tails) completes, charged to ``walks``."""
        if self.inner.try_consume([token]) != 1:
            return None
        joins = self.spelling.joins(witness)
        try:
            found = self.walk(room, joins, looking=True)
        finally:
            self.inner.rollback(1)
        walks.left -= room if found is None else masks_taken(found, joins)
        if found is None:
            if key is not None:
                walks.failed.add(key)
            walks.no_end = True
            return None
        return self._found(token, found, witness, safe, key, True)

    def _tries(
        self, token: int, witness: list[int], key: int | None
    ) -> Iterator[tuple[list[int], bool]]:
        """The known suffixes ``check`` tries after ``token``, in turn (the later ones are
        computed only when the earlier ones fail), each with whether to remember it."""
        memory = self.memory
        if witness and token == witness[0]:
            yield witness[1:], False
        yield witness, False
        yield witness[1:], False
        yield [], False
        aligned = self.spelling.aligned(token, witness)
        if aligned is not None:
            yield aligned, True
        mine = memory.recent.get(token)
        if mine is not None:
            yield mine, False
        known = memory.recent_by_class.get(key) if key is not None else None
        if known is not None and known is not mine:
            yield known, True
        tried = [suffix for suffix in (mine, known) if suffix is not None]
        for bridge, tail in memory.bridges_of(token, key):
            suffix = [*bridge, *witness[tail:]]
            if suffix not in tried:
                tried.append(suffix)
                yield suffix, True
        for other in sorted(memory.learnt, key=len):
            if other is not mine and other is not known:
                yield other, True
        for suffix in memory.realigned(token, self.spelling):
            yield suffix, True

    def record(
        self, token: int, suffix: list[int], witness: list[int], safe: dict[int, list[int]]
    ) -> None:
        """Record ``suffix`` as ``token``'s, known to complete after it without a check
        (``Spelling.aligned_bytes``), as a check that found it records it."""
        self._found(token, suffix, witness, safe, None, False)

    def _found(
        self,
        token: int,
        suffix: list[int],
        witness: list[int],
        safe: dict[int, list[int]],
        key: int | None,
        learnt: bool,
    ) -> list[int]:
        """Record ``suffix`` as ``token``'s; one not from the witness (``learnt``) is
        remembered for the token and its class (``key``): the next rows try it before
        walking."""
        safe[token] = list(suffix)
        self.horizon.saw(len(suffix) - len(witness))
        if learnt:
            self.memory.learn(token, key, safe[token], witness)
        return safe[token]
