"""Finishing by ``max_tokens``: the layer of a grammar row that keeps a completion in reach.

``ClosingMatcher`` wraps the rest of a request's stack (backend matcher, array checks) and
knows the request's budget: ``left`` tokens it may still emit, end-of-sequence included. A
token ``t`` is *safe* when some completion follows it in time: ``1 + d(t) + 1 <= left``,
where ``d(t)`` is the length of a completion found from the state after ``t`` (a witness,
``closing.find_witness``; an upper bound of the true shortest, checked by the matcher).

The row is left exactly as the layers below wrote it while no allowed token can be unsafe,
and narrowed to exactly its safe tokens otherwise:

- **Far** (``left - 2 >= need + reach``): ``need`` is the current witness's length and
  ``grow`` bounds how much one token raises it (the root witness's length in tokens, at
  least ``GROW``, raised to the largest rise any exact check of this request has seen);
  ``reach`` is the same in bytes (one token can open text written a token per byte: a
  date-time's digits), at least the grammar's rise (``root_rise``: an optional key whose
  value is longer than the whole root witness). Nothing is checked and nothing is
  cleared. The witness is followed for free while the output takes its tokens; otherwise
  its bound rises by ``grow`` per token until it must be refreshed (a known suffix still
  completing: the old witness or its tails, the rest of its text after tokens that wrote
  its first bytes, the bytes finishing a cut UTF-8 character before it, the hex digits
  a ``\\u`` escape spanning tokens owes; else a walk).
- **Within reach** (``need + grow <= left - 2 < need + reach``): a narrow row (a key, a
  value's first token) loses the tokens after which a walk finds no completion in time
  (``_clear_risers``); a wide row (text) is left as it is.
- **Near**: a row allowing only the witness's first token is the witness's own check
  (``_only_the_witness``); otherwise every allowed token is checked: ``t`` followed by a
  known suffix (the witness, its tail, the witness's text after ``t``'s, nothing, then what
  earlier checks of this request found after ``t``, after its class, or last: ``recent``,
  ``learnt``) completing in time, else a walk from after ``t`` that ends where the witness
  completes (``WALK_TOKENS`` a row, ``NARROW_WALK_TOKENS`` in a narrow one, charged a walk's
  spelt length or, when it finds nothing, its room: up to about twice that in masks, since
  a walk goes a character at a time; none after a token whose known suffix completes but
  is too long, or after a member of a class whose walk found nothing this row; a token
  left unchecked is cleared, so a narrowed row never holds an unsafe token). A check is
  one ``completes`` of the matcher (llguidance: about 2 us); a walk costs a mask per
  token, so a suffix found once is tried again before walking.
- **Near, the same row again**: a committed row allowing exactly the tokens of the
  request's last near row, with the same witness (text inside a free string), takes that
  row's sort (``_sorted_again``): only kept suffixes that no longer fit are checked again,
  a wide row's class whose suffix no longer fits by sorting that class alone (its tokens
  cleared stay cleared; outside free text, where equal rows and witnesses need not be
  equal states, every kept suffix of a narrow row is checked again, and a wide row is
  sorted afresh). The same across requests of one
  grammar (``shared_sorts``): a row another request checked with the same words and
  witness, and as much room or more, is taken from the grammar's store (a batch with one
  schema checks the first row inside each string once).
  A wide row (more than ``EXACT_MAX`` tokens allowed: free text, an enum's values) is
  checked per class of tokens with the same structure (runs of plain bytes collapsed:
  ``"abc`` and ``"xy`` are one class; in a free string's row, ``text_classes``, where
  ``a{b`` and ``,`` are text too; the grouping, ``class_spans``, is the row's alone and
  kept per vocabulary for a few rows): its shortest and longest member stand for it; a class
  where either fails is checked token by token (those writing the witness's first bytes,
  then ``CLASS_CHECKS`` others: in free text, where both ends fail, only those with a
  suffix of their own, ``_remembered``; the rest are cleared; in a row of structure, not
  free text, every token cleared so is checked again, up to ``FORCED_CHECKS``, by what
  the grammar forces after it: an enum value's rest). A member taken on its class's word is
  not trusted as a witness: the next step checks it. With no room left after a token
  (``left == 2``) it must end the output itself: one check, no suffix, no walk. Before a
  walk, a token's bridge is tried (what a walk of this request took after it, or its
  class, before a witness completed, put before this row's witness; for a token cut inside
  a UTF-8 character, the fewest tokens that finish it). A wide row's token is walked from
  only where there is slack (``left - 2`` at least the witness's length); a narrow row's,
  always (within ``NARROW_WALK_TOKENS``).
- **No slack** (``left - 2`` less than the witness's length), **or one token of it**
  (equal: a UTF-8 lead byte or a ``\\`` owes one token more): only tokens completing as
  shortly as the witness (or one token longer) stay, so the witness must be the shortest
  known: one walk looks for a shorter one, once along a witness of at most
  ``SHORTER_WITNESS_MAX`` tokens (one followed from far away need not be the shortest from
  here: ``":`` ``2`` ``}}`` where ``":""`` ``}}`` also completes); in a narrow row, whose sort
  walks after its tokens, only once the sort clears a token (then the row is sorted again
  from the shorter witness, if one is found); inside free text, not again at an equal row
  and witness where it found none.

So a budget that every path fits (``max_tokens`` at least the longest completion plus one)
never narrows a row, and from the first narrowed step on every allowed token keeps a
completion in reach, so the output completes by ``max_tokens``. A single token that raises
the need by more than ``grow`` while far can still leave too little room; the request then
runs on with the grammar's own row and is cut at ``max_tokens`` (``length``, never a
``stop`` on an incomplete output), and the engine logs it once.

Example::

    stack = closing_layer(grammar, vocab, limit=params.max_tokens)
    stack.consume(new_tokens)
    stack.fill(bitmask, row)   # the grammar's row, narrowed only near the budget
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.closing import (
    allowed_ids,
    completes,
    find_witness,
    literal_tokens,
    root_witness,
)
from constrained.grammars.closing_sorts import (
    Sort,
    WideRow,
    keep_sort,
    nearest,
    new_sort,
    shared_sorts,
    sort_key,
)
from constrained.grammars.matcher import Matcher, MatcherWrapper, row_ids, words_for
from constrained.grammars.token_shapes import (
    hex_finish,
    in_free_text,
    owed_hex_digits,
    prefix_tokens,
    text_classes,
    token_classes,
    token_finish,
)

if TYPE_CHECKING:
    import torch

    from constrained.grammars.vocab import Vocab

logger = logging.getLogger(__name__)

GROW = 8  # the least rise of the need one token is assumed to cause at most
EXACT_MAX = 64  # rows allowing more tokens are checked per class
WALK_TOKENS = 96  # walk budget per narrowed row, for tokens no known suffix completes after
# (charged a found walk's spelt length, a failed one's room: masks run to about twice it)
NARROW_WALK_TOKENS = 3 * WALK_TOKENS  # the same for a narrow near row (at most
# ``EXACT_MAX`` tokens, each walked: an enum's first tokens, a key's; the rows of one
# schema's requests share its sort, ``shared_sorts``)
RISER_WALK_TOKENS = 4 * WALK_TOKENS  # the same for a narrow row within reach (a key row:
# its prefixes' walks fail first)
RECHECK_EVERY = 16  # tokens before walking again after a walk found no completion,
# doubled after each such walk in a row (a failed walk runs to its room: 40-100 ms inside a
# string whose ``pattern`` the walk cannot meet, each time, for a row that is cut anyway)
SHORTER_WITNESS_MAX = 16  # a witness this short or shorter is walked for a shorter one
# once where it leaves no slack or one token of it
FINISH_BASES = 3  # known suffixes tried after the bytes that finish a UTF-8 character
# the output's last token cut, where the witness did not follow
LEARNT = 8  # suffixes found by walks that every later check tries before a walk of its own
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
RISE_PROBE_MASKS = 512  # masks a grammar's rise probe may walk (``root_rise``, once a grammar)
RISE_WALK_TOKENS = 96  # ... and one walk of it


def _others(words: np.ndarray, eos: int) -> int:
    """How many tokens a row (its uint32 words) allows besides end-of-sequence (which the
    layers below allow only where the output is complete: never a token to check)."""
    has_eos = int(words[eos >> 5] >> np.uint32(eos & 31) & 1)
    return int(np.bitwise_count(words).sum()) - has_eos


def _wide(words: np.ndarray, eos: int) -> bool:
    """Whether a row allows more than ``EXACT_MAX`` tokens besides end-of-sequence (free
    text, an enum's values): checked per class, not token by token (``_sort_tokens``)."""
    return _others(words, eos) > EXACT_MAX


class Walks:
    """What one row may still walk: ``left`` masks (``WALK_TOKENS``), the classes where
    a walk after a member found nothing in reach (their other members are not walked: a
    UTF-8 lead byte fails as its neighbours do), and whether the last check found its
    token cannot end in time (``no_end``: a known suffix completes but is too long, or its
    walk found nothing; not a check cut short by the walk budget)."""

    def __init__(self, why: bool = False) -> None:
        self.left = WALK_TOKENS
        self.failed: set[int] = set()
        self.no_end = False
        self.why = why  # whether a failed check must say if it was ``no_end`` (risers)


BRIDGES = 256  # bridges a request keeps (``ClosingMatcher.bridges``)
JOIN_TAILS = 12  # the witness's boundary tails a check's walk may end on (the shortest)
_BOUNDARY = (b",", b"}", b"]")  # the witness's bytes that begin a tail to join


def _masks_taken(found: list[int], joins: Sequence[list[int]]) -> int:
    """The masks a walk that ended on one of ``joins`` took: ``found`` less the join it
    ends with (the longest that matches; at least one)."""
    tail = max((len(j) for j in joins if j and found[-len(j) :] == j), default=0)
    return max(len(found) - tail, 1)


def root_rise(grammar: Any, vocab: Vocab, scratch: torch.Tensor | None = None) -> int:
    """The most one token of a narrow row along a grammar's root witness raises the need
    (tokens; 0 when none does), walked once per grammar object and kept on it.

    At each state the root witness passes through, every token of a narrow row (at most
    ``EXACT_MAX`` allowed: keys, a value's first token) that the witness's rest does not
    complete after is walked from: ``1 + len(walk) - len(rest)``. It finds what the root
    witness's length cannot: an optional key that opens a value longer than the whole
    witness (``{"a":true}`` is 10 bytes; after ``{"stamp":"`` a date-time needs about 22
    tokens). ``ClosingMatcher`` widens ``reach`` to it, so such a key is kept out while it
    cannot finish. Bounded by ``RISE_PROBE_MASKS`` masks; a walk that finds nothing in
    ``RISE_WALK_TOKENS`` adds nothing (``grow`` still adapts to rises seen later).
    """
    cached = grammar.__dict__.get("_root_rise")
    if cached is not None:
        return cached
    rise = 0
    witness = root_witness(grammar, vocab, scratch)
    if witness:
        if scratch is None:
            import torch

            scratch = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
        matcher, masks = grammar.matcher(), RISE_PROBE_MASKS
        for index, next_token in enumerate(witness):
            rest = witness[index + 1 :]
            matcher.fill(scratch, 0)
            keep = allowed_ids(scratch[0], vocab.width)
            keep[vocab.eos_token_id] = False
            tokens = np.flatnonzero(keep).tolist()
            for token in tokens if len(tokens) <= EXACT_MAX else ():
                if masks <= 0:
                    break
                if token == next_token or completes(matcher, [token, *rest]):
                    continue
                taken = matcher.try_consume([token])
                limit = min(RISE_WALK_TOKENS, masks)
                walk = find_witness(matcher, vocab, limit, scratch, joins=[rest]) if taken else None
                matcher.rollback(taken)
                masks -= limit if walk is None else len(walk) + 1
                if walk is not None:
                    rise = max(rise, 1 + len(walk) - len(rest))
            if not matcher.consume([next_token]):
                break
    grammar._root_rise = rise
    return rise


def closing_layer(
    grammar: Any,
    vocab: Vocab,
    limit: int,
    hints: Sequence[list[int]] = (),
    scratch: torch.Tensor | None = None,
    json: bool = False,
) -> ClosingMatcher:
    """A request's closing layer over a new matcher of ``grammar``: it starts from the root
    witness (with ``hints``, a preempted run's completions), reaches as far as the
    grammar's rise (``root_rise``) and shares the grammar's store of near rows. ``json``:
    the grammar is a JSON schema's (``ClosingMatcher``)."""
    root = root_witness(grammar, vocab, scratch)  # walked once per grammar
    hints = [*hints, root] if root is not None else list(hints)
    shared = shared_sorts(grammar)
    closing = ClosingMatcher(grammar.matcher(), vocab, limit, hints, scratch, shared, json)
    closing.reach = max(closing.reach, root_rise(grammar, vocab, scratch))
    return closing


class ClosingMatcher(MatcherWrapper):
    """The stack below (``inner``) plus the budget: every output completes by ``limit``."""

    def __init__(
        self,
        inner: Matcher,
        vocab: Vocab,
        limit: int,
        hints: Sequence[list[int]] = (),
        scratch: torch.Tensor | None = None,
        shared: OrderedDict | None = None,
        json: bool = False,
    ) -> None:
        super().__init__(inner)
        self.vocab = vocab
        # A JSON schema's grammar, where JSON's literals (``true``, ``null``) are shortcuts
        # everywhere: a walk that only looks for more (a check's, a shorter witness's) is
        # not walked again without them (``_walk``).
        self.json = json
        self.eos = vocab.eos_token_id
        self.limit = limit  # max_tokens: output tokens, end-of-sequence included
        self.spent = 0  # output tokens before this stack's first (a thinking block)
        # Tokens consumed through this layer, look-aheads included (an escape's ``\\u``
        # spans tokens: ``_escape_finish``); ``count`` is how many.
        self.tokens: list[int] = []
        # One token can open a structure as large as what the output needs from its start
        # (the root witness, the longest hint): checking begins that far from the budget.
        self.grow = max(GROW, max((len(h) for h in hints), default=0))
        # The same counted in bytes: a witness spelt in long tokens (``"aside":true``) is
        # short, but one token can open text written a token per byte (a date-time's
        # digits). Within it a narrow row loses the tokens a walk finds no end after
        # (``_clear_risers``); only within ``grow`` is every row checked.
        pieces = vocab.token_bytes()
        self.reach = max(self.grow, max((sum(len(pieces[t]) for t in h) for h in hints), default=0))
        self.witness: list[int] | None = None  # a completion from the committed state
        self.need_bound = 1 << 30  # upper bound of the need while the witness is unknown
        self.safe: dict[int, list[int]] = {}  # last checked row: token -> its suffix
        self.by_class: dict[int, list[int]] = {}  # ... a wide row's class -> its ends' suffix
        # The same for draft rows since the last commit, by the look-ahead before them.
        self.drafts: dict[tuple[int, ...], tuple[dict[int, list[int]], dict[int, list[int]]]] = {}
        # Suffixes to try before a walk; at first, a preempted request's earlier stack's
        # (``suffixes``): a fresh walk may find only longer ones.
        self.candidates: list[list[int]] = sorted(hints, key=len)
        self.hints = self.candidates  # kept: a resumed output may be replayed in one step
        self.ahead: list[int] = []  # look-ahead tokens past the committed state
        self.narrowed = False  # the last committed near row was narrowed (not by risers)
        self.warned = False
        self.walk_after = 0  # no walk before this count (the last one found nothing)
        self.failed_walks = 0  # walks in a row from the committed state that found nothing
        # The last suffix other than the witness's that completed after a token, and after a
        # member of a wide row's class (a walk's, mostly: ``",`` needs the next property, a
        # UTF-8 lead byte its continuation): tried before walking again, in this row and the
        # next ones, and when the output takes that token (checked by the matcher each time).
        self.recent: dict[int, list[int]] = {}
        self.recent_by_class: dict[int, list[int]] = {}
        self.learnt: list[list[int]] = []  # the last few of them, any token's, newest first
        self.learnt_texts: list[bytes] = []  # ... each with its token, as text (``_realigned``)
        # What a walk took after a token (key ``-1 - token``) or a member of a class (its
        # key) before the witness of its row, or its tail, completed (``\xa1\xa2`` after
        # the UTF-8 lead byte ``\xe0``, ``":""`` after a key): tried, before the suffixes
        # above, with whatever witness a later row has. The request's own: a row depends on
        # its request's output only, not on what other requests walked before it.
        self.bridges: OrderedDict[int, tuple[tuple[int, ...], int]] = OrderedDict()
        self._scratch = scratch  # a host bitmask row for walks (the writer's: one per engine)
        # The last committed near row's sort (reused while the row stays the same: text
        # inside a string), and the grammar's, shared by its requests (``shared_sorts``).
        self._last_sort: Sort | None = None
        self.shared = shared
        self._witness_text: tuple | None = None  # ``_text_of``'s last answer
        self._witness_joins: tuple | None = None  # ``_joins``'s last answer
        self.shortest_tried = False  # a walk for a shorter witness ran along this one
        self.no_shorter: tuple | None = None  # ... and found none, at this free-text state

    # -- the budget -----------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Tokens consumed through this layer (look-aheads included)."""
        return len(self.tokens)

    @property
    def left(self) -> int:
        """Tokens the request may still emit here, end-of-sequence included."""
        return self.limit - self.spent - self.count

    # -- following the output -------------------------------------------------------------

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        ok = self.inner.consume(tokens)
        self.tokens += tokens
        self.ahead = []
        self._follow(tokens)
        return ok and self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        taken = self.inner.try_consume(tokens) if self.error is None else 0
        taken_tokens = list(tokens)[:taken]
        self.ahead += taken_tokens
        self.tokens += taken_tokens
        return taken

    def rollback(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        self.inner.rollback(num_tokens)
        del self.tokens[max(len(self.tokens) - num_tokens, 0) :]
        if num_tokens <= len(self.ahead):
            del self.ahead[len(self.ahead) - num_tokens :]
        else:  # committed tokens undone: what was known of the state is gone
            self.ahead, self.witness, self.safe, self.by_class = [], None, {}, {}
            self.shortest_tried = False
            self.candidates, self._last_sort, self.drafts = [], None, {}  # drafts: old states
            self.need_bound = 1 << 30

    def _follow(self, new: list[int]) -> None:
        """The witness after committed ``new`` tokens, where it follows for free."""
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
            # found it at another state (``_sorted_again``), where it need not complete.
            if start is witness or completes(self.inner, tail):
                self.shortest_tried &= start is witness  # (a tail of the one tried)
                self.witness, self.candidates = tail, []
                self.need_bound = len(tail)
                return
        # Off the witness: it may still complete (text inside a string), or its class's
        # suffix may, or neither; the need rises by at most ``grow`` a token.
        keys = self._class_keys(new[-1])
        found = [by_class[key] for key in keys if key in by_class]
        tries = found or list(self.candidates)
        # what an earlier row's check found after this token or one of its class
        tries += [s for s in (self.recent.get(new[-1]), *map(self.recent_by_class.get, keys)) if s]
        tries += self.learnt  # (sorted below)
        if len(new) > 1:  # a replayed (resumed) output or accepted drafts: what was known
            tries += self.hints
        if witness is not None:  # and its tails: the new tokens may stand for its first ones
            tries += [witness[k:] for k in range(min(len(new), len(witness)) + 1)]
            # ... or write its first bytes in other tokens (``{"ches`` against the witness
            # ``{"`` ``chess``...): the rest of its text, as the tokenizer writes it
            pieces = self.vocab.token_bytes()
            aligned = self._aligned_text(b"".join(pieces[t] for t in new), witness)
            if aligned is not None:
                tries.append(aligned)
            self.need_bound = len(witness)
        # A token that ends inside a UTF-8 character (text in a string): the bytes that
        # finish it, then what completed before it (the witness, or the shortest few tried)
        finish = list(token_finish(self.vocab, new[-1]))
        if finish:
            bases = [witness] if witness else [c for c in self.candidates if c][:FINISH_BASES]
            tries += [[*finish, *base] for base in bases]
        # ... or inside a ``\u`` escape (``#\`` ``uD``): its hex digits, then what completed
        # after a token of its class (one that finished the escape at once: ``n``) or after
        # the witness's first token (``n`` ``":""``...)
        escape = self._escape_finish() if not finish else ()
        if escape:
            bases = [
                *found,
                *([witness, witness[1:]] if witness else self.candidates[:FINISH_BASES]),
            ]
            tries += [[*escape, *base] for base in bases]
        self.need_bound += self.grow * len(new)
        self.candidates = sorted(tries, key=len)
        self.witness, self.shortest_tried = None, False

    def _escape_finish(self) -> tuple[int, ...]:
        """The hex digits a ``\\u`` escape the output ends inside still owes (``ace``
        after ``#\\`` ``uD``: no one token's finish, ``token_finish``), as the fewest tokens
        that write them; none where the output does not end inside one."""
        pieces = self.vocab.token_bytes()
        tail = b"".join(pieces[t] for t in self.tokens[-8:])[-16:]
        if b"\\u" not in tail:
            return ()
        return hex_finish(self.vocab, owed_hex_digits(tail))

    def suffixes(self) -> list[list[int]]:
        """Every completion this layer knows of (and each one's tails: drafts may have taken
        a suffix's first tokens), for the stack of a resumed request (``hints``)."""
        known = [*self.safe.values(), *self.by_class.values(), *self.candidates]
        if self.witness is not None:
            known.append(self.witness)
        return [suffix[k:] for suffix in known for k in range(len(suffix) + 1)]

    def _known_witness(self) -> list[int] | None:
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
        if ahead[-1] in safe:
            return safe[ahead[-1]]
        tries = [by_class[key] for key in self._class_keys(ahead[-1]) if key in by_class]
        if witness is not None:
            tries += [witness[k:] for k in range(min(len(ahead), len(witness)) + 1)]
        return next((s for s in sorted(tries, key=len) if completes(self.inner, s)), None)

    def _class_keys(self, token: int) -> tuple[int, int]:
        """The token's class as a structure and as free text (a sort keyed its classes by
        one or the other, as its row was)."""
        return (int(token_classes(self.vocab)[0][token]), int(text_classes(self.vocab)[0][token]))

    def _row(self) -> torch.Tensor:
        """The host bitmask row walks fill (made at the first walk if none was given)."""
        if self._scratch is None:
            import torch

            self._scratch = torch.zeros(1, words_for(self.vocab.width), dtype=torch.int32)
        return self._scratch

    def _walk(
        self, limit: int, joins: Sequence[list[int]] = (), looking: bool = False
    ) -> list[int] | None:
        """A completion from the current state within ``limit`` (``find_witness``), ending
        early where one of ``joins`` completes. ``looking``: a walk for more than the row
        needs (a check's, a shorter witness's), walked once in a JSON schema's grammar."""
        # Joins only end a walk early: the same walk without them finds nothing more.
        found = find_witness(self.inner, self.vocab, limit, self._row(), joins=joins)
        if looking and self.json:  # (the second walk found a shorter one for 1 of 236)
            return found
        literals = literal_tokens(self.vocab)
        # Outside JSON, JSON's literals (``true``, ``null``) are no shortcut: walk without.
        if found is None or any(literals[token] for token in found):
            other = find_witness(self.inner, self.vocab, limit, self._scratch, plain_text=True)
            if other is not None and (found is None or len(other) < len(found)):
                return other
        return found

    # -- the row -------------------------------------------------------------------------

    def _narrow_own(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None:
            return
        committed = not self.ahead
        if committed:
            self.narrowed = False
        left = self.left
        if left - 2 >= self._bound() + self.reach:
            return  # far: no allowed token can be unsafe
        witness = self._known_witness()
        if witness is None and self.count < self.walk_after:
            return  # a walk from near here found nothing: the next one a few tokens on
        if witness is None:
            witness = self._walk(max(left - 1, 0))
            if committed:
                self.failed_walks = 0 if witness is not None else self.failed_walks + 1
                if witness is None:
                    self.walk_after = self.count + (RECHECK_EVERY << (self.failed_walks - 1))
        if committed:
            self.witness, self.candidates = witness, []
            self.need_bound = len(witness) if witness is not None else 1 << 30
        if witness is not None and len(witness) + 1 > left:  # a walk may find a shorter one
            witness = self._walk(max(left - 1, 0)) or witness
            if committed:
                self.witness, self.need_bound = witness, len(witness)
                self.shortest_tried = True
        shorter_after_sort = False  # a narrow row's walk for a shorter witness: after its sort
        if (
            witness is not None
            and committed
            and not self.shortest_tried
            and (left - 2 <= len(witness) > 1)
            and len(witness) <= SHORTER_WITNESS_MAX
        ):
            # No slack, or one token of it: only tokens completing as shortly as the
            # witness (or one token longer: ``\xc2`` owes a byte, ``\`` a ``"``) stay. A
            # witness followed from far away need not be the shortest from here (``":``
            # ``2`` ``}}`` where ``":""`` ``}}`` also completes): one walk, once along it. Not
            # for a long witness: a long walk each time, and an output at the least budget
            # admission takes is safest on the one path it was admitted for. A narrow row
            # walks after its tokens in its sort, so its walk waits for a token the sort
            # clears (one whose known suffix, the witness's text, completes but is too long).
            words = bitmask[row].numpy().view(np.uint32)
            if _wide(words, self.eos):
                self.shortest_tried = True
                # Inside free text, equal rows and witnesses stand for equal states (as in
                # ``_sorted_again``): a walk that found no shorter one is not run again.
                text = (
                    (tuple(witness), hash(words.tobytes()))
                    if in_free_text(self.vocab, words)
                    else None
                )
                shorter = (
                    self._walk(len(witness) - 1, looking=True)
                    if text is None or text != self.no_shorter
                    else None
                )
                if shorter is not None and len(shorter) < len(witness):
                    witness = self.witness = shorter
                    self.need_bound = len(witness)
                else:
                    self.no_shorter = text
            else:
                shorter_after_sort = True
        if witness is None or len(witness) + 1 > left:
            self._warn(left, None if witness is None else len(witness) + 1)
            return  # no completion found in reach: the grammar's row, and a cut
        if left - 2 >= len(witness) + self.reach:
            return
        words = bitmask[row].numpy().view(np.uint32)
        if left - 2 >= len(witness) + self.grow:  # within reach, not near: risers only
            self._clear_risers(bitmask, row, words, witness, left, committed)
            return
        only = self._only_the_witness(words, witness)
        if only is not None:  # (half the near rows of structure in a mixed batch: keys)
            if committed:
                self.safe, self.by_class = only, {}
            else:
                self.drafts[tuple(self.ahead)] = (only, {})
            return
        sort, key = None, None
        if committed:
            sort = self._sorted_again(self._last_sort, words, witness, left)
            if sort is None and self.shared is not None:
                key = sort_key(witness, words)
                sort = self._sorted_again(nearest(self.shared.get(key), left), words, witness, left)
        if sort is None:
            sort = new_sort(words.copy() if committed else words, witness, left,
                            *self._sort_tokens(bitmask, row, witness, left))  # fmt: skip
            if shorter_after_sort and sort.unsafe:
                self.shortest_tried = True
                shorter = self._walk(len(witness) - 1, looking=True)
                if shorter is not None and len(shorter) < len(witness):
                    self.witness, self.need_bound = shorter, len(shorter)
                    return self._narrow_own(bitmask, row)  # the row again, from there
        safe, by_class, unsafe = sort.safe, sort.by_class, sort.unsafe
        if committed:
            self.safe, self.by_class, self.narrowed = safe, by_class, bool(unsafe)
            self._remember(sort, key)
        else:
            self.drafts[tuple(self.ahead)] = (safe, by_class)
        if unsafe:
            before = words.copy() if not (safe or by_class) else None  # all may be cleared
            unsafe.apply(words)
            if before is not None and not words.any():
                self._keep_witness(words, witness, before, left)

    def _clear_risers(
        self,
        bitmask: torch.Tensor,
        row: int,
        words: np.ndarray,
        witness: list[int],
        left: int,
        committed: bool,
    ) -> None:
        """A row within ``reach`` of the budget but not within ``grow``: a narrow row (a
        key, a value's first token: where one token can open a long value) loses the tokens
        after which no completion fits (a known suffix too long, or a walk that finds none
        in ``RISER_WALK_TOKENS`` masks a row; a token left unchecked stays); a wide row
        (text) is left as it is."""
        if _wide(words, self.eos):
            return
        only = self._only_the_witness(words, witness)
        if only is not None:  # (a fifth of the riser rows, for nothing)
            if committed:
                self.safe = only
            return
        eos = self.eos
        ids = row_ids(words)
        ids = ids[(ids != eos) & (ids < self.vocab.width)]
        if ids.size > EXACT_MAX:
            return
        safe: dict[int, list[int]] = {}
        walks, risers = Walks(why=True), []
        walks.left = RISER_WALK_TOKENS
        tokens = ids.tolist()
        for token in tokens:
            if self._check(token, witness, left, safe, walks) is None and walks.no_end:
                risers.append(token)
        if committed:
            self.safe = safe
        if risers and len(risers) < len(tokens):
            ids = np.asarray(risers, dtype=np.int64)
            np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))

    def _only_the_witness(
        self, words: np.ndarray, witness: list[int]
    ) -> dict[int, list[int]] | None:
        """A row's checks where it allows only the witness's first token (a key's next
        piece), or nothing but end-of-sequence: nothing to clear, and that token's check is
        the witness's own. ``None`` for any other row."""
        others = _others(words, self.eos)
        if others == 0:
            return {}
        first = witness[0] if witness else None
        if others == 1 and first is not None and words[first >> 5] >> np.uint32(first & 31) & 1:
            return {first: list(witness[1:])}
        return None

    def _keep_witness(
        self, words: np.ndarray, witness: list[int], before: np.ndarray, left: int
    ) -> None:
        """A narrowed row left empty. Where the matcher accepts the witness
        (``completes``), the layers below did not allow its first token (llguidance 1.7.6
        did, after a mask inside an undone look-ahead, until its matcher computed those on
        a copy: ``LLGuidanceMatcher``; kept as a guard for any backend). The row keeps that
        token rather than nothing. Otherwise (no witness known to complete here) the row is
        the grammar's, unnarrowed, and the output may be cut: a row never allows a token the
        matcher refuses, and is never empty."""
        if not witness or not completes(self.inner, witness):
            words[:] = before
            self._warn(left, None)
            return
        first = witness[0]
        words[first // 32] |= np.uint32(1) << np.uint32(first % 32)
        logger.warning(
            "constrained: the grammar's row left out the only token that completes in time "
            "(id %d, accepted by the matcher); kept",
            first,
        )

    def _bound(self) -> int:
        """An upper bound of the need at the current state (committed or look-ahead)."""
        ahead = self.ahead
        if not ahead:
            return self.need_bound
        witness = self.witness
        if witness is not None and ahead == witness[: len(ahead)]:
            return len(witness) - len(ahead)
        return self.need_bound + self.grow * len(ahead)

    def _remember(self, sort: Sort, key: tuple | None) -> None:
        """Keep a committed near row's sort for the next rows of this request and, in the
        grammar's store, for other requests (by its words and witness, then its room: a
        sort serves a request with as much room or less)."""
        self.grow = max(self.grow, sort.longest - len(sort.witness))
        self.reach = max(self.reach, self.grow)
        self._last_sort = sort
        if self.shared is not None:
            keep_sort(self.shared, sort, key)

    def _sorted_again(
        self, last: Sort | None, words: np.ndarray, witness: list[int], left: int
    ) -> Sort | None:
        """An earlier sort (this request's last near row, or one of the grammar's store),
        when this row allows the same tokens with the same witness, checked with as much
        room or more (text the grammar's state does not count, as plain text inside a free
        string; or another request at the same state): each kept suffix that no longer
        fits is checked again, a class's by sorting that class alone (``_sort_class``; the
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
        safe, unsafe, walks = dict(last.safe), [], Walks()
        by_class, resorted = last.by_class, np.zeros(0, np.int64)
        too_long = [key for key, suffix in by_class.items() if len(suffix) > room]
        if too_long:  # (free text: a row of structure with classes returned above)
            # Each such class sorted again, as ``_sort_tokens`` sorts it; the others keep
            # their suffixes (the same state: what completed in time still does).
            keep = self._checkable(words)
            wide = WideRow(self.vocab, words, keep, self._leads(witness), self._remembered)
            spans = {span[2]: span for span in wide.spans}
            by_class = {key: suffix for key, suffix in by_class.items() if len(suffix) <= room}
            for key in too_long:
                span = spans[key]
                safe.pop(span[3], None)
                safe.pop(span[4], None)
                found = self._sort_class(wide, span, witness, left, safe, walks)
                if found is not None:
                    by_class[key] = found
            resorted = wide.cleared()
        classes = (text_classes if text else token_classes)(self.vocab)[0]
        again = [
            token
            for token, suffix in safe.items()
            if len(suffix) > room or not (text or completes(self.inner, [token, *suffix]))
        ]
        for token in again:
            del safe[token]
            if self._check(token, witness, left, safe, walks, int(classes[token])) is None:
                unsafe.append(token)
        more = np.concatenate([resorted, np.asarray(unsafe, np.int64)])
        cleared = last.unsafe.plus(more, last.words.size)
        return new_sort(last.words, witness, left, safe, by_class, cleared)

    def _checkable(self, words: np.ndarray) -> np.ndarray:
        """A near row's tokens to check, as booleans by id: those its ``words`` allow, but
        end-of-sequence (the layers below allow it only where the output is complete)."""
        keep = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab.width]
        keep = keep.astype(bool)
        keep[self.eos] = False
        return keep

    def _sort_tokens(
        self, bitmask: torch.Tensor, row: int, witness: list[int], left: int
    ) -> tuple[dict[int, list[int]], dict[int, list[int]], list[int] | np.ndarray]:
        """The allowed tokens checked to keep a completion within ``left`` (with their
        suffixes), the wide row's classes kept on their ends' word (with the longer end's
        suffix), and the tokens that do not keep one (or were not checked)."""
        words = bitmask[row].numpy().view(np.uint32)
        keep = self._checkable(words)
        safe: dict[int, list[int]] = {}
        by_class: dict[int, list[int]] = {}
        unsafe: list[int] = []
        walks = Walks()
        if np.count_nonzero(keep) <= EXACT_MAX:
            walks.left = NARROW_WALK_TOKENS
            for token in np.flatnonzero(keep).tolist():
                if self._check(token, witness, left, safe, walks) is None:
                    unsafe.append(token)
            return safe, by_class, unsafe
        wide = WideRow(self.vocab, words, keep, self._leads(witness), self._remembered)
        for span in wide.spans:
            found = self._sort_class(wide, span, witness, left, safe, walks)
            if found is not None:
                by_class[span[2]] = found
        cleared = wide.cleared()
        if not wide.text and cleared.size:  # an enum's values: each one's forced rest
            cleared = self._keep_forced(cleared, left, safe)
        return safe, by_class, cleared

    def _sort_class(
        self,
        wide: WideRow,
        span: tuple[int, int, int, int, int],
        witness: list[int],
        left: int,
        safe: dict[int, list[int]],
        walks: Walks,
    ) -> list[int] | None:
        """One class of a wide row: the suffix its ends keep (they stand for it), else
        ``None``, its members checked one by one where they may differ and the rest left to
        ``wide`` to clear."""
        begin, end, key, first, last = span
        ends = {first, last}
        ends_ok = [self._check(t, witness, left, safe, walks, key) for t in ends]
        if all(found is not None for found in ends_ok):  # they stand for the class
            return max(ends_ok, key=len)  # type: ignore[arg-type]
        # Its members checked one by one: first those writing the witness's first bytes
        # (its own first token among them), then up to CLASS_CHECKS others. Inside
        # free text a class's members differ only in their plain run's length, and the
        # need after them is monotone in it (a free string: equal; ``minLength``: it
        # falls; ``maxLength``: it rises): where both ends fail, only the members this
        # request learnt a suffix of their own for (``_remembered``: their ends do not
        # try it) are checked besides the leads (an engine's batch of 55 MaskBench
        # schemas at ``max_tokens`` 64: none of 12,043 member checks kept a token).
        inner = wide.ordered[begin + 1 : end - 1]
        both_failed = wide.text and all(found is None for found in ends_ok)
        if both_failed and not wide.has_special(key):  # (most: no member to check)
            wide.unchecked.append(inner)
        else:
            lead = wide.is_lead[inner]
            others = inner[~lead]
            if both_failed:
                mine = wide.remembered[others]
                wide.unchecked.append(others[~mine])
                others = others[mine]  # (a few, or none)
            checked = inner[lead].tolist() + others[:CLASS_CHECKS].tolist()
            wide.unsafe += [
                t for t in checked if self._check(t, witness, left, safe, walks, key) is None
            ]
            wide.unchecked.append(others[CLASS_CHECKS:])
        wide.unsafe += [t for t in ends if t not in safe]
        return None

    def _remembered(self) -> np.ndarray:
        """Which tokens (by id) a check may keep on what this request learnt of that very
        token rather than its class: a suffix found after it (``recent``), its bridge, or
        being the first bytes of a learnt completion's text (``_realigned``)."""
        known = np.zeros(self.vocab.width, dtype=bool)
        known[list(self.recent)] = True
        known[[-1 - key for key in self.bridges if key < 0]] = True
        for text in self.learnt_texts:  # (a strict prefix: ``_realigned``'s condition)
            known[list(prefix_tokens(self.vocab, text, min(len(text) - 1, 47)))] = True
        return known

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
            done = self._forced_check(token, left, safe)
            if done:
                kept.append(token)
            elif done is not None:
                short.append(token)
        masks = FORCED_WALK_MASKS if kept else 0
        for token in short:
            if masks <= 0:
                break
            found = self._walk_after(token, left - 2)
            masks -= left - 2 if found is None else max(len(found), 1)
            if found is not None:
                safe[token] = found
                kept.append(token)
        return np.setdiff1d(cleared, kept) if kept else cleared

    def _forced_check(self, token: int, left: int, safe: dict[int, list[int]]) -> bool | None:
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

    def _walk_after(self, token: int, room: int) -> list[int] | None:
        """A completion after ``token`` within ``room`` (``find_witness``), or ``None``."""
        if self.inner.try_consume([token]) != 1:
            return None
        try:
            return find_witness(self.inner, self.vocab, room, self._row())
        finally:
            self.inner.rollback(1)

    def _leads(self, witness: list[int]) -> set[int]:
        """Tokens whose bytes begin the witness's text (``</`` and ``</param`` for a
        witness ``</`` ``parameter`` ``>``...)."""
        pieces = self.vocab.token_bytes()
        return prefix_tokens(self.vocab, b"".join(pieces[token] for token in witness[:8]), 48)

    def _text_of(self, witness: list[int]) -> tuple[bytes, dict[int, int]]:
        """The witness's text and its tokens' bounds in it (byte offset -> tokens before),
        kept for the last witness: a sort asks for every token it checks."""
        kept = self._witness_text
        if kept is not None and kept[0] is witness and kept[1] == len(witness):
            return kept[2], kept[3]
        pieces = self.vocab.token_bytes()
        text, bounds = b"", {0: 0}
        for k, tok in enumerate(witness, start=1):
            text += pieces[tok]
            bounds[len(text)] = k
        self._witness_text = (witness, len(witness), text, bounds)
        return text, bounds

    def _joins(self, witness: list[int]) -> list[list[int]]:
        """What a check's walk tries to end on at every state it reaches: the witness, its
        tail after its first token, and its tails from each member or item boundary (a
        token of the witness that begins with ``,`` ``}`` ``]``): after ``":-`` the walk
        takes ``1`` and the rest of the object is the witness's own (one mask, not 70).
        Such a byte inside a token (the ``,`` of ``},"`` or ``","``) starts a tail too, its
        text as the tokenizer writes it: a walk that took ``]}`` goes on with ``,"`` and the
        rest (the last ``JOIN_TAILS`` of each kind)."""
        kept = self._witness_joins
        if kept is not None and kept[0] is witness and kept[1] == len(witness):
            return kept[2]
        pieces = self.vocab.token_bytes()
        heads = [k for k in range(2, len(witness)) if pieces[witness[k]][:1] in _BOUNDARY]
        joins = [witness, witness[1:], *(witness[k:] for k in heads[-JOIN_TAILS:])]
        text, bounds = self._text_of(witness)
        first = len(pieces[witness[0]]) if witness else 0
        inside = [  # boundaries inside a token (after the first): their tails as text
            at
            for at in range(first + 1, len(text))
            if text[at : at + 1] in _BOUNDARY and at not in bounds
        ]
        for at in inside[-JOIN_TAILS:]:
            spelt = self._spelt(text[at:])
            if spelt is not None:
                joins.append(spelt)
        self._witness_joins = (witness, len(witness), joins)
        return joins

    def _aligned(self, token: int, witness: list[int]) -> list[int] | None:
        """The witness's text after the token's, when the token writes the witness's first
        bytes (``",`` against ``"`` ``,"b":0}``): the rest, as the witness's own tokens where
        the token ends on one of their bounds, else as the tokenizer writes it."""
        return self._aligned_text(self.vocab.token_bytes()[token], witness)

    def _aligned_text(self, piece: bytes, witness: list[int]) -> list[int] | None:
        """``_aligned`` for the text ``piece`` (one token's, or a run of them)."""
        if not piece or not witness:
            return None
        rest, bounds = self._text_of(witness)
        if not rest.startswith(piece):
            return None
        if len(piece) in bounds:
            return witness[bounds[len(piece)] :]
        return self._spelt(rest[len(piece) :])

    def _spelt(self, text: bytes) -> list[int] | None:
        """``text`` as the tokenizer writes it; ``None`` where it does not decode (it
        starts or ends inside a UTF-8 character)."""
        try:
            return self.vocab.encode(text.decode())
        except UnicodeDecodeError:
            return None

    def _check(
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
            return (
                self._found(token, [], witness, safe, key, False)
                if completes(self.inner, [token])
                else None
            )
        longer = []  # known suffixes too long for the room: tried only where it matters
        for suffix, learnt in self._tries(token, witness, key):
            if len(suffix) <= room:
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
        if self.inner.try_consume([token]) != 1:
            return None
        joins = self._joins(witness)
        try:
            found = self._walk(room, joins, looking=True)
        finally:
            self.inner.rollback(1)
        walks.left -= room if found is None else _masks_taken(found, joins)
        if found is None:
            if key is not None:
                walks.failed.add(key)
            walks.no_end = True
            return None
        return self._found(token, found, witness, safe, key, True)

    def _tries(
        self, token: int, witness: list[int], key: int | None
    ) -> Iterator[tuple[list[int], bool]]:
        """The known suffixes ``_check`` tries after ``token``, in turn (the later ones are
        computed only when the earlier ones fail), each with whether to remember it."""
        if witness and token == witness[0]:
            yield witness[1:], False
        yield witness, False
        yield witness[1:], False
        yield [], False
        aligned = self._aligned(token, witness)
        if aligned is not None:
            yield aligned, True
        mine = self.recent.get(token)
        if mine is not None:
            yield mine, False
        known = self.recent_by_class.get(key) if key is not None else None
        if known is not None and known is not mine:
            yield known, True
        tried = [suffix for suffix in (mine, known) if suffix is not None]
        for bridge, tail in self._bridges_of(token, key):
            suffix = [*bridge, *witness[tail:]]
            if suffix not in tried:
                tried.append(suffix)
                yield suffix, True
        for other in sorted(self.learnt, key=len):
            if other is not mine and other is not known:
                yield other, True
        for suffix in self._realigned(token):
            yield suffix, True

    def _realigned(self, token: int) -> Iterator[list[int]]:
        """The rest of a learnt completion's text after the token's, where the token writes
        its first bytes (``":["`` against ``":[`` ``"a"]}``: ``a"]}``), as the tokenizer
        writes it: a walk's find serves the tokens that begin the same way."""
        piece = self.vocab.token_bytes()[token]
        for text in self.learnt_texts:
            if len(text) > len(piece) and text.startswith(piece):
                rest = self._spelt(text[len(piece) :])
                if rest is not None:
                    yield rest

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
        self.grow = max(self.grow, len(suffix) - len(witness))
        self.reach = max(self.reach, self.grow)
        if learnt:
            self.recent[token] = safe[token]
            if key is not None:
                self.recent_by_class[key] = safe[token]
            self._bridge(token, key, suffix, witness)
            if suffix not in self.learnt:
                self.learnt = [safe[token], *self.learnt[: LEARNT - 1]]
                pieces = self.vocab.token_bytes()
                text = pieces[token] + b"".join(pieces[t] for t in suffix)
                self.learnt_texts = [text, *self.learnt_texts[: LEARNT - 1]]
        return safe[token]

    def _bridge(self, token: int, key: int | None, suffix: list[int], witness: list[int]) -> None:
        """Keep what ``suffix`` adds before ``witness`` (or its tail) as the token's and its
        class's bridge."""
        pieces = self.vocab.token_bytes()
        total = b"".join(pieces[t] for t in suffix)
        bridge = None
        for tail in (0, 1):  # on bytes: a walk's suffix is spelt again (``shortest_spelling``)
            end = b"".join(pieces[t] for t in witness[tail:])
            cut = len(total) - len(end)
            if not end or cut <= 0 or not total.endswith(end):
                continue
            size, k = 0, 0
            while size < cut:  # the suffix's tokens before the witness's text, if one ends there
                size += len(pieces[suffix[k]])
                k += 1
            if size == cut:
                bridge = (tuple(suffix[:k]), tail)
                break
        if bridge is None:
            return
        bridges = self.bridges
        for bridged in (-1 - token, key):
            if bridged is not None:
                bridges[bridged] = bridge
                bridges.move_to_end(bridged)
        while len(bridges) > BRIDGES:
            bridges.popitem(last=False)

    def _bridges_of(self, token: int, key: int | None) -> Iterator[tuple[Sequence[int], int]]:
        """The bridges known for a token, then its class, and for a token that ends inside
        a UTF-8 character or an escape what finishes it (``\xe0`` -> ``\xa0`` ``\x80``,
        ``\\`` -> ``"``: ``token_finish``)."""
        for bridged in (-1 - token, key):
            if bridged is not None and bridged in self.bridges:
                yield self.bridges[bridged]
        finish = token_finish(self.vocab, token)
        if finish:
            yield finish, 0

    def _warn(self, left: int, needed: int | None) -> None:
        """Say once, in the engine's log, that this request may be cut at ``max_tokens``."""
        if self.warned or self.ahead:
            return
        self.warned = True
        found = f"needs {needed} tokens" if needed is not None else "none"
        logger.warning(
            "constrained: no completion of an output found within max_tokens=%d (%d tokens "
            "left; the shortest found: %s): it may be cut at max_tokens (docs/budget.md, "
            "where closing cannot apply)",
            self.limit,
            left,
            found,
        )
