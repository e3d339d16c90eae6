"""Deciding a near row (``closing_matcher.py``): which of its allowed tokens keep a
completion in reach, by the ``Checker``.

A narrow row (at most ``EXACT_MAX`` tokens besides end-of-sequence: keys, a value's first
token) is checked token by token. A wide row (free text, an enum's values) is checked per
class of tokens with the same structure (``token_shapes.class_spans``): its shortest and
longest member stand for it; a class where either fails is checked member by member (the
tokens writing the witness's first bytes, then ``CLASS_CHECKS`` others; in free text only
those the request learnt a suffix of their own for), the rest cleared; in a row of structure
the cleared tokens are checked again by what the grammar forces after them (an enum value's
rest). A token left unchecked is cleared; a class kept on its ends' word keeps its inner
members unchecked (in free text the need after a member is monotone in its plain run's
length, so the ends bound it; docs/budget.md, where closing cannot apply).

Example::

    sorter = RowSorter(checker)
    safe, by_class, unsafe = sorter.sort_tokens(words, witness, left)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from constrained.grammars.closing import completes
from constrained.grammars.closing_check import WALK_TOKENS, Walks
from constrained.grammars.closing_sorts import Sort, WideRow, new_sort
from constrained.grammars.token_shapes import (
    after_text,
    in_free_text,
    text_classes,
    token_classes,
    token_finish,
)

if TYPE_CHECKING:
    from constrained.grammars.closing_check import Checker

logger = logging.getLogger(__name__)

EXACT_MAX = 64  # rows allowing more tokens are checked per class
NARROW_WALK_TOKENS = 3 * WALK_TOKENS  # the walk budget of a narrow near row (at most
# ``EXACT_MAX`` tokens, each walked: an enum's first tokens, a key's; the rows of one
# schema's requests share its sort, ``closing_sorts``)
CLASS_CHECKS = 8  # members of a wide row's class checked one by one when its ends differ
FORCED_CHECKS = 512  # tokens a wide row of structure (an enum's values, not free text)
# would clear, checked again by what the grammar forces after them (one ``forced()`` and one
# check each: an enum of 500 licence ids kept 1 of 346 first tokens, ``Cu`` finishing in 2)
FORCED_TRIAL = 64  # ... given up when none of the first this many is kept (a string's
# ``pattern`` or ``format``: wide rows of structure where nothing is forced after a token)
FORCED_WALK_MASKS = NARROW_WALK_TOKENS  # ... then, in a row where some forced rest ends
# the output (an enum's), masks the walks after the tokens whose forced rest stops short
# may take (``EC`` forces ``L-``, then ``1.0"`` is one of two values; a failed walk is
# charged its room)


def others(words: np.ndarray, eos: int) -> int:
    """How many tokens a row (its uint32 words) allows besides end-of-sequence (which the
    layers below allow only where the output is complete: never a token to check)."""
    has_eos = int(words[eos >> 5] >> np.uint32(eos & 31) & 1)
    return int(np.bitwise_count(words).sum()) - has_eos


def wide(words: np.ndarray, eos: int) -> bool:
    """Whether a row allows more than ``EXACT_MAX`` tokens besides end-of-sequence (free
    text, an enum's values): checked per class, not token by token."""
    return others(words, eos) > EXACT_MAX


def only_the_witness(
    words: np.ndarray, witness: list[int], eos: int, count: int | None = None
) -> dict[int, list[int]] | None:
    """A row's checks where it allows only the witness's first token (a key's next
    piece), or nothing but end-of-sequence: nothing to clear, and that token's check is
    the witness's own. ``None`` for any other row. ``count``: ``others(words, eos)``, if
    known."""
    count = others(words, eos) if count is None else count
    if count == 0:
        return {}
    first = witness[0] if witness else None
    if count == 1 and first is not None and words[first >> 5] >> np.uint32(first & 31) & 1:
        return {first: list(witness[1:])}
    return None


class RowSorter:
    """Sorts a request's near rows into kept and cleared tokens, with ``checker``'s checks."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.vocab = checker.vocab
        self.eos = checker.vocab.eos_token_id

    def checkable(self, words: np.ndarray) -> np.ndarray:
        """A near row's tokens to check, as booleans by id: those its ``words`` allow, but
        end-of-sequence (the layers below allow it only where the output is complete)."""
        keep = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab.width]
        keep = keep.astype(bool)
        keep[self.eos] = False
        return keep

    def _wide_row(self, words: np.ndarray, keep: np.ndarray, witness: list[int]) -> WideRow:
        memory, spelling = self.checker.memory, self.checker.spelling
        return WideRow(self.vocab, words, keep, spelling.leads(witness), memory.remembered)

    def sort_tokens(
        self, words: np.ndarray, witness: list[int], left: int
    ) -> tuple[dict[int, list[int]], dict[int, list[int]], list[int] | np.ndarray]:
        """The allowed tokens checked to keep a completion within ``left`` (with their
        suffixes), the wide row's classes kept on their ends' word (with the longer end's
        suffix), and the tokens that do not keep one (or were not checked)."""
        keep = self.checkable(words)
        safe: dict[int, list[int]] = {}
        by_class: dict[int, list[int]] = {}
        unsafe: list[int] = []
        if np.count_nonzero(keep) <= EXACT_MAX:
            walks = Walks(left=NARROW_WALK_TOKENS)
            for token in np.flatnonzero(keep).tolist():
                if self.checker.check(token, witness, left, safe, walks) is None:
                    unsafe.append(token)
            return safe, by_class, unsafe
        walks = Walks()
        row = self._wide_row(words, keep, witness)
        for span in row.spans:
            found = self.sort_class(row, span, witness, left, safe, walks)
            if found is not None:
                by_class[span[2]] = found
        cleared = row.cleared()
        if not row.text and cleared.size:  # an enum's values: each one's forced rest
            cleared = self._keep_forced(cleared, left, safe)
        return safe, by_class, cleared

    def sort_class(
        self,
        row: WideRow,
        span: tuple[int, int, int, int, int],
        witness: list[int],
        left: int,
        safe: dict[int, list[int]],
        walks: Walks,
    ) -> list[int] | None:
        """One class of a wide row: the suffix its ends keep (they stand for it), else
        ``None``, its members checked one by one where they may differ and the rest left to
        ``row`` to clear."""
        check = self.checker.check
        begin, end, key, first, last = span
        ends = {first, last}
        ends_ok = [check(t, witness, left, safe, walks, key) for t in ends]
        if all(found is not None for found in ends_ok):  # they stand for the class
            return max(ends_ok, key=len)  # type: ignore[arg-type]
        # Its members checked one by one: first those writing the witness's first bytes
        # (its own first token among them), then up to CLASS_CHECKS others. Inside
        # free text a class's members differ only in their plain run's length, and the
        # need after them is monotone in it (a free string: equal; ``minLength``: it
        # falls; ``maxLength``: it rises): where both ends fail, only the members this
        # request learnt a suffix of their own for (``SuffixMemory.remembered``: their ends
        # do not try it) are checked besides the leads (an engine's batch of 55 MaskBench
        # schemas at ``max_tokens`` 64: none of 12,043 member checks kept a token).
        inner = row.ordered[begin + 1 : end - 1]
        both_failed = row.text and all(found is None for found in ends_ok)
        if both_failed and not row.has_special(key):  # (most: no member to check)
            row.unchecked.append(inner)
        elif both_failed:  # its leads and remembered members only, from the row's few
            checked = row.special_members(key, ends, CLASS_CHECKS)
            kept = [t for t in checked if check(t, witness, left, safe, walks, key) is not None]
            row.unchecked.append(inner[~np.isin(inner, kept)] if kept else inner)
        else:
            lead = row.is_lead[inner]
            rest = inner[~lead]
            checked = inner[lead].tolist() + rest[:CLASS_CHECKS].tolist()
            row.unsafe += [t for t in checked if check(t, witness, left, safe, walks, key) is None]
            row.unchecked.append(rest[CLASS_CHECKS:])
        row.unsafe += [t for t in ends if t not in safe]
        return None

    def _keep_forced(
        self, cleared: np.ndarray, left: int, safe: dict[int, list[int]]
    ) -> np.ndarray:
        """``cleared`` less the tokens (the first ``FORCED_CHECKS``) whose forced rest
        completes in time (none tried past ``FORCED_TRIAL`` when none of those did); then,
        in a row where some did (an enum's, not a ``pattern``'s text), those whose forced
        rest stops short but a walk after it completes in time (``FORCED_WALK_MASKS``)."""
        kept: list[int] = []
        short: list[int] = []  # tokens whose forced rest does not end the output
        for k, token in enumerate(cleared[:FORCED_CHECKS].tolist()):
            if k == FORCED_TRIAL and not kept:
                break  # nothing forced after these (a ``pattern``'s text): not an enum
            done = self.checker.forced_check(token, left, safe)
            if done:
                kept.append(token)
            elif done is not None:
                short.append(token)
        masks = FORCED_WALK_MASKS if kept else 0
        for token in short:
            if masks <= 0:
                break
            found = self.checker.walk_after(token, left - 2)
            masks -= left - 2 if found is None else max(len(found), 1)
            if found is not None:
                safe[token] = found
                kept.append(token)
        return np.setdiff1d(cleared, kept) if kept else cleared

    def sorted_again(
        self, last: Sort | None, words: np.ndarray, witness: list[int], left: int
    ) -> Sort | None:
        """An earlier sort (this request's last near row, or one of the grammar's store),
        when this row allows the same tokens with the same witness, checked with as much
        room or more (text the grammar's state does not count, as plain text inside a free
        string; or another request at the same state): each kept suffix that no longer
        fits is checked again, a class's by sorting that class alone (``sort_class``; the
        other classes keep their suffixes, the tokens it cleared stay cleared: with less
        room at the same state none of them completes by a suffix it tried); ``None`` when
        it differs.

        Equal rows and witnesses stand for equal states inside free text only: ``":{"``
        after two keys whose objects differ has the same row and witness (``":{}}``) and
        other completions. So outside free text every kept suffix is checked again (a
        narrow row: at most ``EXACT_MAX``; a wide one is sorted afresh)."""
        if (
            last is None
            or last.left < left
            or last.witness != witness
            or not np.array_equal(last.words, words)
        ):
            return None
        text = in_free_text(self.vocab, words)
        if not text and last.by_class:
            return None
        room = left - 2
        if text and last.longest <= room:
            return last
        safe, walks = dict(last.safe), Walks()
        by_class, resorted = self._classes_again(last, words, witness, left, safe, walks)
        classes = (text_classes if text else token_classes)(self.vocab)[0]
        inner = self.checker.inner
        again = [
            token
            for token, suffix in safe.items()
            if len(suffix) > room or not (text or completes(inner, [token, *suffix]))
        ]
        unsafe = []
        for token in again:
            del safe[token]
            if self.checker.check(token, witness, left, safe, walks, int(classes[token])) is None:
                unsafe.append(token)
        more = np.concatenate([resorted, np.asarray(unsafe, np.int64)])
        cleared = last.unsafe.plus(more, last.words.size)
        return new_sort(last.words, witness, left, safe, by_class, cleared)

    def _classes_again(
        self,
        last: Sort,
        words: np.ndarray,
        witness: list[int],
        left: int,
        safe: dict[int, list[int]],
        walks: Walks,
    ) -> tuple[dict[int, list[int]], np.ndarray]:
        """``sorted_again``'s classes: each class whose kept suffix no longer fits sorted
        again, as ``sort_tokens`` sorts it; the others keep their suffixes (the same state:
        what completed in time still does). The classes kept, and the tokens cleared.

        Only free text gets here (a row of structure with classes is sorted afresh), so
        a class re-sorted is at the state its ends were checked at, with less room. A class
        that ``_may_fit_again`` rules out is cleared whole without checking its ends again,
        as ``sort_class`` clears it once both ends fail. A heuristic, not a proof: it may
        clear a class a fresh sort keeps (never the reverse: a distortion, not a cut) where
        a shorter suffix it does not look for fits: one of the request's ``learnt``
        suffixes, or, in a string with ``minLength``, the witness's rest after text of the
        right length, or a suffix another request's stored sort found. Measured: the mixed
        batch's masks (MaskBench schemas at ``max_tokens`` 32, 64 and 128) bit for bit, and
        ``closing_walks`` over 120 schemas identical per schema."""
        room = left - 2
        by_class = last.by_class
        too_long = [key for key, suffix in by_class.items() if len(suffix) > room]
        if not too_long:
            return by_class, np.zeros(0, np.int64)
        row = self._wide_row(words, self.checkable(words), witness)
        spans = {span[2]: span for span in row.spans}
        by_class = {key: suffix for key, suffix in by_class.items() if len(suffix) <= room}
        for key in too_long:
            span = spans[key]
            safe.pop(span[3], None)
            safe.pop(span[4], None)
            if not self._may_fit_again(row, span, witness):
                row.unchecked.append(row.ordered[span[0] : span[1]])
                continue
            found = self.sort_class(row, span, witness, left, safe, walks)
            if found is not None:
                by_class[key] = found
        return by_class, row.cleared()

    def _may_fit_again(
        self, row: WideRow, span: tuple[int, int, int, int, int], witness: list[int]
    ) -> bool:
        """Whether a free-text class kept on the ends' suffix may complete by a shorter one
        with less room: a member with suffixes of its own (a lead of the witness's text, a
        token the request remembers, ``WideRow.has_special``; the class's own suffix or
        bridge, ``SuffixMemory``), members that leave a character or an escape half-written
        (their finish, ``token_finish``), or members that go on, after their text, with the
        witness's first token (``a","`` or ``","+`` against ``","`` ``"]``: the witness's
        rest after it; the class keeps those bytes as written, ``after_text``)."""
        key, first = span[2], span[3]
        memory = self.checker.memory
        if row.has_special(key) or key in memory.recent_by_class or key in memory.bridges:
            return True
        if token_finish(self.vocab, first):
            return True
        pieces = self.vocab.token_bytes()
        tail, lead = after_text(pieces[first]), pieces[witness[0]] if witness else b""
        return bool(tail and lead) and (tail.startswith(lead) or lead.startswith(tail))

    def keep_witness(self, words: np.ndarray, witness: list[int], before: np.ndarray) -> bool:
        """A narrowed row left empty. Where the matcher accepts the witness
        (``completes``), the layers below did not allow its first token (llguidance 1.7.6
        did, after a mask inside an undone look-ahead, until its matcher computed those on
        a copy: ``LLGuidanceMatcher``; kept as a guard for any backend). The row keeps that
        token rather than nothing. Otherwise (no witness known to complete here) the row is
        the grammar's, unnarrowed, and ``False``: the output may be cut. A row never allows
        a token the matcher refuses, and is never empty."""
        if not witness or not completes(self.checker.inner, witness):
            words[:] = before
            return False
        first = witness[0]
        words[first // 32] |= np.uint32(1) << np.uint32(first % 32)
        logger.warning(
            "constrained: the grammar's row left out the only token that completes in time "
            "(id %d, accepted by the matcher); kept",
            first,
        )
        return True
