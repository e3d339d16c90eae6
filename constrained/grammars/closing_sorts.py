"""Near rows' sorts (``grammars/closing_matcher.py``): a wide row's sort in progress
(``WideRow``: its classes, and what it clears), the tokens a sort clears (``Cleared``: ids
while few, else the row's words as bits), a sort (``Sort``: the row's words, witness and
room, the kept suffixes, the cleared tokens), and a compiled grammar's store of them,
shared by its requests (``new_store``, kept in ``closing_tables.ClosingTables``: by words
and witness, then room; a batch with one schema checks the first row inside each string
once; all grammars' stores together within ``SHARED_BYTES``, ``MEMORY``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.grammars.token_shapes import class_spans, in_free_text, text_classes, token_classes

if TYPE_CHECKING:
    from collections.abc import Callable

    from constrained.grammars.vocab import Vocab


class WideRow:
    """A wide row's sort in progress (``ClosingMatcher._sort_tokens``): its allowed tokens
    in class order with each class's span (``class_spans``), whether it is free text, the
    tokens writing the witness's first bytes (``leads``), those with a suffix of their own
    (``SuffixMemory.remembered``, read when a class first needs them: ``has_special``), and
    what the sort clears (``unsafe`` ids, ``unchecked`` arrays of them). Leads and
    remembered tokens are kept as sets, grouped by class: a sort that needs no pass over a
    class makes none over the vocabulary either."""

    def __init__(
        self,
        vocab: Vocab,
        words: np.ndarray,
        keep: np.ndarray,
        leads: set[int],
        remembered: Callable[[], set[int]],
    ) -> None:
        self.vocab = vocab
        self.keep = keep
        self.text = in_free_text(vocab, words)
        self.ordered, self.spans = class_spans(vocab, words, keep, self.text)
        self.leads = leads
        self._read = remembered
        self._is_lead: np.ndarray | None = None
        self._special: dict[int, list[int]] | None = None
        self.unsafe: list[int] = []
        self.unchecked: list[np.ndarray] = []

    @property
    def is_lead(self) -> np.ndarray:
        """The leads as booleans by id (one lookup a class, not an ``isin``)."""
        if self._is_lead is None:
            self._is_lead = np.zeros(self.vocab.width, dtype=bool)
            self._is_lead[list(self.leads)] = True
        return self._is_lead

    def has_special(self, key: int) -> bool:
        """Whether some token of class ``key`` is a lead or remembered (then its members
        are looked at one by one; a class without one is cleared whole, with no pass over
        its members: a free-text row with no slack clears most of its 40-odd classes)."""
        return key in self._specials()

    def special_members(self, key: int, ends: set[int], most: int) -> list[int]:
        """Class ``key``'s allowed members but ``ends`` that are leads, then up to ``most``
        remembered ones, each in class order (byte length, then id): what ``sort_class``
        checks one by one in free text where both ends failed, found among the row's few
        special tokens rather than by passes over the class (the free-text class has
        145,000 members)."""
        ids = [t for t in self._specials().get(key, ()) if self.keep[t] and t not in ends]
        lengths = (text_classes if self.text else token_classes)(self.vocab)[1]
        ids.sort(key=lambda t: (int(lengths[t]), t))
        leads = [t for t in ids if t in self.leads]
        return leads + [t for t in ids if t not in self.leads][:most]

    def _specials(self) -> dict[int, list[int]]:
        """The leads and remembered tokens (ids) by class."""
        if self._special is None:
            ids = sorted(self.leads | self._read())
            classes = (text_classes if self.text else token_classes)(self.vocab)[0]
            special: dict[int, list[int]] = {}
            for token, key in zip(ids, classes[ids].tolist(), strict=True):
                special.setdefault(key, []).append(token)
            self._special = special
        return self._special

    def cleared(self) -> np.ndarray:
        """The tokens this sort clears (int64 ids)."""
        return np.concatenate([np.asarray(self.unsafe, np.int64), *self.unchecked])


class Cleared:
    """The tokens a near row clears: their ids while few, else a bitmask of the row's words
    (a wide row near the end clears most of the vocabulary: 151,936 ids as Python ints were
    5 MB a sort, as a bitmask 19 KB)."""

    __slots__ = ("bits", "ids")

    def __init__(self, ids: list[int] | np.ndarray, words: int) -> None:
        flat = np.asarray(ids, dtype=np.int64)
        self.ids: np.ndarray | None = None
        self.bits: np.ndarray | None = None
        if flat.size <= words:
            self.ids = flat.astype(np.int32)
        else:
            self.bits = _set_bits(np.zeros(words, dtype=np.uint32), flat)

    def __bool__(self) -> bool:
        return bool(self.ids.size) if self.ids is not None else bool(self.bits.any())

    def apply(self, words: np.ndarray) -> None:
        """Clear these tokens in a row's words (in place)."""
        if self.bits is not None:
            np.bitwise_and(words, ~self.bits, out=words)
        elif self.ids.size:
            ids = self.ids.astype(np.int64)
            np.bitwise_and.at(words, ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32)))

    def plus(self, more: list[int] | np.ndarray, words: int) -> Cleared:
        """These tokens and ``more``, as a new ``Cleared`` (this one is shared)."""
        more = np.asarray(more, dtype=np.int64)
        if not more.size:
            return self
        if self.bits is not None:
            grown = Cleared([], words)
            grown.ids, grown.bits = None, _set_bits(self.bits.copy(), more)
            return grown
        return Cleared(np.concatenate([self.ids.astype(np.int64), more]), words)


_PACK_FROM = 1024  # ids from which ``_set_bits`` packs booleans rather than ``.at``


def _set_bits(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Set the bits of token ``ids`` (int64) in a row's uint32 ``words``; returns them.
    Many ids (a wide row's cleared vocabulary) are packed from booleans: ``bitwise_or.at``
    over 140k ids took 3.5 ms, the packing 0.2."""
    if ids.size <= _PACK_FROM:
        np.bitwise_or.at(words, ids // 32, np.uint32(1) << (ids % 32).astype(np.uint32))
        return words
    flags = np.zeros(words.size * 32, dtype=bool)
    flags[ids] = True
    words |= np.packbits(flags, bitorder="little").view(np.uint32)
    return words


@dataclass
class Sort:
    """A committed near row's checks: its allowed words and witness, the room it was
    checked for, the kept tokens' and classes' suffixes, the cleared tokens."""

    words: np.ndarray
    witness: list[int]
    left: int
    safe: dict[int, list[int]]
    by_class: dict[int, list[int]]
    unsafe: Cleared
    longest: int  # the longest kept suffix: while it fits, nothing needs checking again


def new_sort(
    words: np.ndarray,
    witness: list[int],
    left: int,
    safe: dict[int, list[int]],
    by_class: dict[int, list[int]],
    unsafe: list[int] | np.ndarray | Cleared,
) -> Sort:
    longest = max(max(map(len, safe.values()), default=0),
                  max(map(len, by_class.values()), default=0))  # fmt: skip
    cleared = unsafe if isinstance(unsafe, Cleared) else Cleared(unsafe, words.size)
    return Sort(words, witness, left, safe, by_class, cleared, longest)


SHARED_SORTS = 128  # near rows (words and witness) kept per grammar (memory: a sort holds
# its checked suffixes; the soak test bounds what a served round may add)
SHARED_LEFTS = 8  # ... each with its sorts at this many rooms


def sort_key(witness: list[int], words: np.ndarray) -> tuple:
    """A near row's key in a grammar's store: its witness and its allowed words."""
    return (tuple(witness), hash(words.tobytes()))


def keep_sort(store: OrderedDict, sort: Sort, key: tuple | None = None) -> None:
    """Keep ``sort`` in a grammar's store, by its key (``sort_key``) then its room; the most
    recently kept ``SHARED_SORTS`` rows, each at its ``SHARED_LEFTS`` largest rooms (the
    least room goes first); and in all grammars' stores together, the most recently kept
    rows that fit ``SHARED_BYTES`` (``MEMORY``)."""
    if key is None:
        key = sort_key(sort.witness, sort.words)
    by_left = store.get(key)
    if by_left is None:
        by_left = store[key] = {}
    elif by_left:  # equal words (compared on every hit): one array for all of them
        sort.words = next(iter(by_left.values())).words
    by_left[sort.left] = sort
    if len(by_left) > SHARED_LEFTS:
        del by_left[min(by_left)]
    store.move_to_end(key)
    if len(store) > SHARED_SORTS:
        old, _ = store.popitem(last=False)
        MEMORY.forget_row((id(store), old))
    MEMORY.keep_row(store, key, by_left)


def _row_bytes(by_left: dict[int, Sort]) -> int:
    """About what a store's row holds: its words (one array for all its rooms), each
    room's cleared tokens and kept suffixes."""
    held = next(iter(by_left.values())).words.nbytes if by_left else 0
    for sort in by_left.values():
        cleared = sort.unsafe.ids if sort.unsafe.ids is not None else sort.unsafe.bits
        held += cleared.nbytes + _ENTRY_BYTES * (len(sort.safe) + len(sort.by_class))
    return held


SHARED_BYTES = 48 << 20  # about the memory all grammars' stores may hold together
_ENTRY_BYTES = 160  # about what a kept suffix holds (a dict entry, a short list of ints)


class SortMemory:
    """Every grammar's stored rows, least recently kept first (``rows``: (id(store), key)
    -> (the store, its bytes); a store stays alive while it holds a row here), within
    ``SHARED_BYTES`` together (``held``)."""

    def __init__(self) -> None:
        self.rows: OrderedDict[tuple[int, tuple], tuple[OrderedDict, int]] = OrderedDict()
        self.held = 0

    def keep_row(self, store: OrderedDict, key: tuple, by_left: dict[int, Sort]) -> None:
        slot = (id(store), key)
        self.forget_row(slot)
        held = _row_bytes(by_left)
        self.rows[slot] = (store, held)
        self.held += held
        while self.held > SHARED_BYTES and len(self.rows) > 1:  # the least recent goes
            (_, old), (owner, _) = next(iter(self.rows.items()))
            owner.pop(old, None)
            self.forget_row((id(owner), old))

    def forget_row(self, slot: tuple) -> None:
        kept = self.rows.pop(slot, None)
        if kept is not None:
            self.held -= kept[1]

    def forget_store(self, store_id: int) -> None:
        """A grammar died: its store's rows' memory goes with it."""
        for slot in [slot for slot in self.rows if slot[0] == store_id]:
            self.forget_row(slot)

    def forget_all(self) -> None:
        """Empty every grammar's store (benchmarks time each round from a cold store)."""
        for store, _ in self.rows.values():
            store.clear()
        self.rows.clear()
        self.held = 0


MEMORY = SortMemory()


def new_store(grammar: Any) -> OrderedDict:
    """A grammar's store of near rows' sorts (``closing_tables.ClosingTables.sorts``):
    its rows count in ``MEMORY`` until the grammar dies."""
    store: OrderedDict = OrderedDict()
    weakref.finalize(grammar, MEMORY.forget_store, id(store))
    return store


def forget_shared_sorts() -> None:
    """Empty every grammar's store (``SortMemory.forget_all``)."""
    MEMORY.forget_all()


def nearest(by_left: dict[int, Sort] | None, left: int) -> Sort | None:
    """The sort checked with the least room at least ``left`` (the fewest to check again)."""
    if not by_left:
        return None
    found = by_left.get(left)
    if found is None:
        more = [k for k in by_left if k > left]
        found = by_left[min(more)] if more else None
    return found
