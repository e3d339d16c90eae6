"""Following a completion along the output (``closing_matcher.py``): the witness from the
committed state, an upper bound of the need while none is known, and the checks of the
last near row (and of draft rows since the last commit), kept for the step that takes one
of their tokens.

The witness is followed for free while the output takes its tokens; otherwise its bound
rises by ``grow`` per token until it must be refreshed from a known suffix still completing:
the old witness or its tails, the rest of its text after tokens that wrote its first bytes,
the bytes finishing a cut UTF-8 character before it, the hex digits a ``\\u`` escape
spanning tokens owes, what earlier checks found (``SuffixMemory``); else a walk (the layer's).

Example::

    tracker = WitnessTracker(matcher, vocab, memory, spelling, hints=[root_witness])
    tracker.follow(new_tokens, output_tokens, grow=8)
    witness = tracker.known()   # a completion from here, or None: walk for one
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from constrained.grammars.closing import completes
from constrained.grammars.token_shapes import text_classes, token_classes, token_finish

if TYPE_CHECKING:
    from collections.abc import Sequence

    from constrained.grammars.closing_memory import SuffixMemory
    from constrained.grammars.closing_spelling import Spelling
    from constrained.grammars.matcher import Matcher
    from constrained.grammars.vocab import Vocab

FINISH_BASES = 3  # known suffixes tried after the bytes that finish a UTF-8 character
# the output's last token cut, where the witness did not follow
UNKNOWN = 1 << 30  # the need's bound where nothing is known


class WitnessTracker:
    """A request's witness and what its last rows' checks found.

    ``witness``: a completion from the committed state (``None``: not known; the need is
    then at most ``need_bound``). ``safe`` / ``by_class``: the last checked row's suffixes
    by token and by a wide row's class; ``drafts``: the same for draft rows since the last
    commit, by the look-ahead before them. ``candidates``: suffixes to try before a walk (at
    first a preempted request's earlier stack's, ``hints``). ``ahead``: look-ahead tokens
    past the committed state. ``shortest_tried``: a walk for a shorter witness ran along
    this one; ``no_shorter``: ... and found none, at this free-text state.
    """

    def __init__(
        self,
        inner: Matcher,
        vocab: Vocab,
        memory: SuffixMemory,
        spelling: Spelling,
        hints: Sequence[list[int]] = (),
    ) -> None:
        self.inner = inner
        self.vocab = vocab
        self.memory = memory
        self.spelling = spelling
        self.witness: list[int] | None = None
        self.need_bound = UNKNOWN
        self.safe: dict[int, list[int]] = {}
        self.by_class: dict[int, list[int]] = {}
        self.drafts: dict[tuple[int, ...], tuple[dict[int, list[int]], dict[int, list[int]]]] = {}
        # A fresh walk may find only longer suffixes than a preempted request's stack knew.
        self.candidates: list[list[int]] = sorted(hints, key=len)
        self.hints = self.candidates  # kept: a resumed output may be replayed in one step
        self.ahead: list[int] = []
        self.shortest_tried = False
        self.no_shorter: tuple | None = None

    def commit(self, witness: list[int] | None) -> None:
        """``witness`` (a walk's, or ``None``: none found) is the committed state's."""
        self.witness, self.candidates = witness, []
        self.need_bound = len(witness) if witness is not None else UNKNOWN

    def forget(self) -> None:
        """Committed tokens were undone: what was known of the state is gone."""
        self.ahead, self.witness, self.safe, self.by_class = [], None, {}, {}
        self.shortest_tried = False
        self.candidates, self.drafts = [], {}  # drafts: old states
        self.need_bound = UNKNOWN

    def checked(self, safe: dict[int, list[int]], by_class: dict[int, list[int]]) -> None:
        """A near row's checks, kept for the step that takes one of its tokens."""
        if self.ahead:
            self.drafts[tuple(self.ahead)] = (safe, by_class)
        else:
            self.safe, self.by_class = safe, by_class

    def class_keys(self, token: int) -> tuple[int, int]:
        """The token's class as a structure and as free text (a sort keyed its classes by
        one or the other, as its row was)."""
        return (int(token_classes(self.vocab)[0][token]), int(text_classes(self.vocab)[0][token]))

    def bound(self, grow: int) -> int:
        """An upper bound of the need at the current state (committed or look-ahead)."""
        ahead = self.ahead
        if not ahead:
            return self.need_bound
        witness = self.witness
        if witness is not None and ahead == witness[: len(ahead)]:
            return len(witness) - len(ahead)
        return self.need_bound + grow * len(ahead)

    def known(self) -> list[int] | None:
        """A witness from the current state (committed plus look-ahead), found cheaply if
        possible: the committed witness along the look-ahead, the suffix the row before
        checked for the look-ahead's last token, or a known suffix (or tail) still
        completing; the shortest that does."""
        witness, ahead = self.witness, self.ahead
        if not ahead:
            if witness is not None:
                return witness
            return next((s for s in self.candidates if completes(self.inner, s)), None)
        if witness is not None and ahead == witness[: len(ahead)]:
            return witness[len(ahead) :]
        safe, by_class = (
            (self.safe, self.by_class)
            if len(ahead) == 1
            else self.drafts.get(tuple(ahead[:-1]), ({}, {}))
        )
        if ahead[-1] in safe and completes(self.inner, safe[ahead[-1]]):
            return safe[ahead[-1]]  # (checked here: a sort's may be another state's)
        tries = [by_class[key] for key in self.class_keys(ahead[-1]) if key in by_class]
        if witness is not None:
            tries += [witness[k:] for k in range(min(len(ahead), len(witness)) + 1)]
        return next((s for s in sorted(tries, key=len) if completes(self.inner, s)), None)

    def suffixes(self) -> list[list[int]]:
        """Every completion known (and each one's tails: drafts may have taken a suffix's
        first tokens), for the stack of a resumed request (``hints``)."""
        known = [*self.safe.values(), *self.by_class.values(), *self.candidates]
        if self.witness is not None:
            known.append(self.witness)
        return [suffix[k:] for suffix in known for k in range(len(suffix) + 1)]

    def follow(self, new: list[int], output: list[int], grow: int) -> None:
        """The witness after committed ``new`` tokens (``output``: every token consumed,
        ``new`` last), where it follows for free; else the suffixes to try for it."""
        witness, safe, by_class = self.witness, self.safe, self.by_class
        drafts = self.drafts
        self.safe, self.by_class, self.drafts = {}, {}, {}
        if not new:
            return
        if len(new) > 1 and tuple(new[:-1]) in drafts:  # accepted drafts: the last row's
            safe, by_class = drafts[tuple(new[:-1])]
            new, witness = new[-1:], None
        start, rest = (safe[new[0]], new[1:]) if new[0] in safe else (witness, new)
        if start is not None and rest == start[: len(rest)]:
            tail = start[len(rest) :]
            # A checked suffix is checked again: a sort taken from an earlier row may have
            # found it at another state (``RowSorter.sorted_again``), where it need not
            # complete.
            if start is witness or completes(self.inner, tail):
                self.shortest_tried &= start is witness  # (a tail of the one tried)
                self.witness, self.candidates = tail, []
                self.need_bound = len(tail)
                return
        # Off the witness: it may still complete (text inside a string), or its class's
        # suffix may, or neither; the need rises by at most ``grow`` a token.
        keys = self.class_keys(new[-1])
        found = [by_class[key] for key in keys if key in by_class]
        tries = found or list(self.candidates)
        tries += self.memory.after(new[-1], keys)  # what an earlier row's check found
        tries += self.memory.learnt  # (sorted below)
        if len(new) > 1:  # a replayed (resumed) output or accepted drafts: what was known
            tries += self.hints
        if witness is not None:
            tries += self._witness_tails(new, witness)
            self.need_bound = len(witness)
        tries += self._finishes(new[-1], output, found, witness)
        self.need_bound += grow * len(new)
        self.candidates = sorted(tries, key=len)
        self.witness, self.shortest_tried = None, False

    def _witness_tails(self, new: list[int], witness: list[int]) -> list[list[int]]:
        """The witness's tails (the new tokens may stand for its first ones), and the rest
        of its text where the new tokens wrote its first bytes in other tokens (``{"ches``
        against the witness ``{"`` ``chess``...), as the tokenizer writes it."""
        tails = [witness[k:] for k in range(min(len(new), len(witness)) + 1)]
        pieces = self.vocab.token_bytes()
        aligned = self.spelling.aligned_text(b"".join(pieces[t] for t in new), witness)
        if aligned is not None:
            tails.append(aligned)
        return tails

    def _finishes(
        self,
        last: int,
        output: list[int],
        found: list[list[int]],
        witness: list[int] | None,
    ) -> list[list[int]]:
        """Suffixes for an output whose ``last`` token ends inside a UTF-8 character (text
        in a string): the bytes that finish it, then what completed before it (the witness,
        or the shortest few tried); or inside a ``\\u`` escape (``#\\`` ``uD``): its hex
        digits, then what completed after a token of its class (one that finished the
        escape at once: ``n``, ``found``) or after the witness's first token."""
        finish = list(token_finish(self.vocab, last))
        if finish:
            bases = [witness] if witness else [c for c in self.candidates if c][:FINISH_BASES]
            return [[*finish, *base] for base in bases]
        escape = self.spelling.escape_finish(output)
        if not escape:
            return []
        bases = [
            *found,
            *([witness, witness[1:]] if witness else self.candidates[:FINISH_BASES]),
        ]
        return [[*escape, *base] for base in bases]
