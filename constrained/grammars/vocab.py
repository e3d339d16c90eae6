"""The model's vocabulary, in the forms each grammar backend wants, built once per tokenizer.

The logits are often wider than the tokenizer (Qwen2: 151,936 logits, 151,665 tokens); every
backend is built at the logits width so ids past the tokenizer are never allowed. Special
tokens (``<|im_start|>`` ...) are never allowed inside constrained text either: only the
end-of-sequence token, and only where the grammar is complete.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from constrained.grammars.vocab_record import (
    RecordPlace,
    StoredTokenizer,
    keep_record,
    load_record,
    record_key,
)

ENCODED_TEXTS = 4096  # texts ``Vocab.encode`` keeps (closing respells the same few often)

# GPT-2 style byte-level BPE stores byte b as a printable character; this undoes it.
_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        codes = list(printable)
        extra = 0
        for b in range(256):
            if b not in printable:
                printable.append(b)
                codes.append(256 + extra)
                extra += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(printable, codes, strict=True)}
    return _BYTE_DECODER


def _byte_level() -> tuple[Any, dict[int, int]]:
    """A test that a piece is all byte-level characters, and the ``str.translate`` table
    that turns each into the character of its byte (then ``encode("latin-1")``): the pieces'
    bytes at C speed."""
    decoder = _byte_decoder()
    pattern = re.compile("[" + re.escape("".join(decoder)) + "]*")
    return pattern.fullmatch, str.maketrans({ch: chr(b) for ch, b in decoder.items()})


class _LLGuidanceTokens:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes (special tokens and ids
    past the tokenizer as text, listed as special) and a tokenize call (``Vocab.encode``)."""

    def __init__(self, vocab: Vocab) -> None:
        tok = vocab.tokenizer
        added = tok.added_tokens_decoder
        self.eos_token_id = vocab.eos_token_id
        self.bos_token_id = None
        self.tokens = list(vocab.token_bytes())
        self.special_token_ids = [*vocab.special_ids(), *range(len(tok), vocab.width)]
        for token_id in self.special_token_ids:
            if token_id >= len(tok):
                self.tokens[token_id] = f"<[{token_id}]>".encode()
            else:
                named = added.get(token_id)
                text = named.content if named else tok.convert_ids_to_tokens(token_id)
                self.tokens[token_id] = text.encode()
        self._encode = vocab.encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # (the wrapper probes with bytes; it then sends str)
            raise TypeError("text")
        return self._encode(text)


@dataclass
class Vocab:
    """One tokenizer at one logits width, with lazily built backend tokenizers.

    Attributes:
        tokenizer: what this vocabulary reads of the tokenizer: the fast Hugging Face
            tokenizer vLLM serves with, or its record's stand-in (``vocab_record``).
        width: the logits width (``vocab_size`` of the model), >= the tokenizer size.
        eos_token_id: the end-of-sequence token vLLM stops on.
        key: identifies the tokenizer in compile-cache keys.
        load_served: loads the served tokenizer, for a vocabulary built from a record.
    """

    tokenizer: Any
    width: int
    eos_token_id: int
    key: str
    load_served: Callable[[], Any] | None = field(default=None, repr=False)
    _built: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _building: dict[str, threading.Lock] = field(default_factory=dict, repr=False)

    @property
    def hf_tokenizer(self) -> Any:
        """The served Hugging Face tokenizer itself (vLLM's reasoning parsers read it);
        loaded on first read where this vocabulary was built from a record."""
        if self.load_served is None:
            return self.tokenizer
        return self._once("hf_tokenizer", self.load_served)

    @property
    def from_record(self) -> bool:
        """Built from the tokenizer's record (``vocab_record``), not from the tokenizer."""
        return self.load_served is not None

    def _once(self, name: str, build: Any) -> Any:
        built = self._built.get(name)
        if built is not None:  # no lock once built: a build in progress blocks no reader
            return built
        # One lock per table: a thread that needs one waits for its build only, not for
        # another table's (the warm-up thread builds several while the first rows read).
        # A table's build reads only tables it does not lead back to: no lock cycle.
        with self._lock:
            building = self._building.setdefault(name, threading.Lock())
        with building:
            if name not in self._built:
                self._built[name] = build()
            return self._built[name]

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids as the tokenizer writes it (no special tokens added), through
        the fast tokenizer's Rust core where there is one: closing respells every walk it
        keeps (33 us a call against 78 through ``transformers``' Python wrapper), and the
        same few texts again and again (a witness's rest after each token that writes its
        first bytes), so the last ``ENCODED_TEXTS`` are kept."""
        known: dict[str, tuple[int, ...]] = self._once("encoded", dict)
        ids = known.get(text)
        if ids is None:
            core = self._encode_core()
            # The core keeps the truncation or padding a ``transformers`` call last set on
            # it (a frontend sharing the tokenizer): then the wrapper, which resets them (a
            # record's core has neither: ``vocab_record`` clears them when it reads it).
            if core is False or core.truncation is not None or core.padding is not None:
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            else:
                ids = tuple(core.encode(text, add_special_tokens=False).ids)
            if len(known) >= ENCODED_TEXTS:
                known.clear()  # (a plain dict: the fill threads of engines in one process)
            known[text] = ids
        return list(ids)

    def _encode_core(self) -> Any:
        """The Rust core ``encode`` goes through (``False`` when there is none)."""
        return self._once("encode_core", lambda: _rust_core(self.tokenizer) or False)

    def special_ids(self) -> list[int]:
        """The tokenizer's special token ids (its named specials and added tokens marked
        special), sorted: never allowed inside constrained text."""

        def build() -> list[int]:
            tok = self.tokenizer
            added = tok.added_tokens_decoder  # (a property that builds a new dict on every read)
            return sorted(set(tok.all_special_ids) | {i for i, t in added.items() if t.special})

        return self._once("special_ids", build)

    def token_bytes(self) -> list[bytes]:
        """Each id's raw bytes; ``b""`` for special tokens and ids past the tokenizer."""
        return self._once("bytes", self._build_token_bytes)

    def _build_token_bytes(self) -> list[bytes]:
        tok = self.tokenizer
        added = tok.added_tokens_decoder  # (a property that builds a new dict on every read)
        special = set(self.special_ids())
        byte_level, to_bytes = _byte_level()
        out = [b""] * self.width
        for piece, token_id in tok.get_vocab().items():
            if token_id >= self.width or token_id in special:
                continue
            if token_id in added:  # added, not byte-level encoded
                out[token_id] = piece.encode()
            elif byte_level(piece):
                out[token_id] = piece.translate(to_bytes).encode("latin-1")
            else:  # not byte-level (e.g. sentencepiece): decode it
                out[token_id] = tok.convert_tokens_to_string([piece]).encode()
        return out

    def warm(self) -> None:
        """Build the store fingerprint, the llguidance tokenizer, the Rust core ``encode``
        reads (a record's is parsed when first read) and the xgrammar tokenizer (about 1-3 s
        in all); each is built once, so a caller that needs one sooner waits only for what is
        left of its build."""
        self.fingerprint()
        self.llguidance()
        self._encode_core()
        self.xgrammar()

    def fingerprint(self) -> str:
        """A SHA-256 of what the backends see of this tokenizer (each id's bytes, the special
        ids and their text, width, EOS): a compiled grammar is only ever loaded for the
        tokenizer it was compiled for. Over ``token_bytes``, which every first request
        builds anyway: 20 ms for Qwen's 152k tokens, against 0.16 s from the pieces (#55)."""

        def build() -> str:
            pieces = self.token_bytes()
            specials = self.special_ids()
            texts = [str(self.tokenizer.convert_ids_to_tokens(i)) for i in specials]
            digest = hashlib.sha256(f"{self.width}|{self.eos_token_id}|".encode())
            digest.update(array("q", map(len, pieces)).tobytes())  # (the joined bytes split)
            digest.update(b"".join(pieces))
            digest.update(json.dumps([specials, texts]).encode())
            return digest.hexdigest()

        return self._once("fingerprint", build)

    def llguidance(self) -> Any:
        """``llguidance.LLTokenizer`` over ``token_bytes``, with the tokens and specials its
        Hugging Face path (``llguidance.hf.from_tokenizer``) gives, token for token: special
        tokens by their text and ids past the tokenizer as ``<[id]>``, both marked special;
        it tokenizes through the fast tokenizer's Rust core. 0.4 s against that path's 2.5 s,
        which parses the tokenizer's JSON again."""

        def build() -> Any:
            import llguidance

            return llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_LLGuidanceTokens(self)),
                n_vocab=self.width,
                eos_token=self.eos_token_id,
            )

        return self._once("llguidance", build)

    def xgrammar(self, written: frozenset[int] = frozenset()) -> Any:
        """``xgrammar.TokenizerInfo`` from raw bytes, special tokens blanked but ``written``
        (special tokens a structural tag spells in its delimiters, as their text).

        Built RAW rather than from the HF tokenizer: xgrammar's HF path lets Qwen's special
        tokens appear inside JSON strings.
        """

        def build() -> Any:
            import xgrammar

            pieces = list(self.token_bytes())
            for token_id in written:
                pieces[token_id] = self.tokenizer.convert_ids_to_tokens(token_id).encode()
            return xgrammar.TokenizerInfo(
                pieces,
                xgrammar.VocabType.RAW,
                vocab_size=self.width,
                stop_token_ids=[self.eos_token_id],
            )

        return self._once("xgrammar" + "".join(f",{i}" for i in sorted(written)), build)

    def specials_in(self, texts: Iterable[str]) -> frozenset[int]:
        """The special tokens (never end-of-sequence) whose text occurs in one of ``texts``."""
        tok = self.tokenizer
        return frozenset(
            token_id
            for token_id, added in tok.added_tokens_decoder.items()
            if added.special and token_id != self.eos_token_id and token_id < self.width
            and any(added.content in text for text in texts)
        )  # fmt: skip

    def outlines(self) -> Any:
        """``outlines_core.Vocabulary`` built by hand (its ``from_pretrained`` needs the hub)."""

        def build() -> Any:
            from outlines_core import Vocabulary

            groups: dict[bytes, list[int]] = {}
            for token_id, piece in enumerate(self.token_bytes()):
                if piece and token_id != self.eos_token_id:
                    groups.setdefault(piece, []).append(token_id)
            return Vocabulary(self.eos_token_id, groups)

        return self._once("outlines", build)


_VOCABS: dict[tuple[str, int, int | None], Vocab] = {}
_VOCABS_LOCK = threading.Lock()


def is_loaded(tokenizer_path: str, width: int) -> bool:
    """Whether this process has built the ``Vocab`` ``load_vocab(tokenizer_path, width)``
    returns."""
    return (tokenizer_path, width, None) in _VOCABS


def load_vocab(
    tokenizer_path: str,
    width: int,
    eos_token_id: int | None = None,
    hf_tokenizer: Any = None,
    find_tokenizer: Callable[[], Any] | None = None,
    records: RecordPlace | None = None,
) -> Vocab:
    """The ``Vocab`` of a tokenizer directory (or hub name), built once per process.

    From, in this order: ``hf_tokenizer`` (the same tokenizer, already loaded: vLLM has one)
    when it is a fast Hugging Face one; the tokenizer's record where ``records`` says
    (``vocab_record``: a process that had the tokenizer saved it); what ``find_tokenizer``
    loads; ``AutoTokenizer``. A vocabulary built from a tokenizer keeps its record there
    (``keep_record``), for the processes that do not have it.
    """
    key = (tokenizer_path, width, eos_token_id)
    with _VOCABS_LOCK:
        vocab = _VOCABS.get(key)
        if vocab is None:
            vocab = _build(
                tokenizer_path, width, eos_token_id, hf_tokenizer, find_tokenizer, records
            )
            _VOCABS[key] = vocab
        return vocab


def _build(
    path: str,
    width: int,
    eos_token_id: int | None,
    tok: Any,
    find_tokenizer: Callable[[], Any] | None,
    records: RecordPlace | None,
) -> Vocab:
    def load() -> Any:
        found = find_tokenizer() if find_tokenizer is not None else None
        return found if is_fast_hf(found) else _load_tokenizer(path)

    name = f"{path}@{width}"
    store = records.find_store() if records is not None else None
    record_at = None
    if store is not None:
        record_at = record_key(path, width, eos_token_id, records.parts)
    if not is_fast_hf(tok):
        record = load_record(store, record_at) if record_at is not None else None
        if record is not None:
            stand_in = record.tokenizer
            eos = stand_in.eos_token_id if eos_token_id is None else eos_token_id
            vocab = Vocab(stand_in, len(record.token_bytes), int(eos), name, load_served=load)
            vocab._built.update(
                bytes=record.token_bytes,
                special_ids=stand_in.all_special_ids,
                fingerprint=record.fingerprint,
            )
            return vocab
        tok = load()
    eos = tok.eos_token_id if eos_token_id is None else eos_token_id
    vocab = Vocab(tok, max(width, len(tok)), int(eos), key=name)
    if record_at is not None:
        keep_record(
            store, record_at, tok, vocab.token_bytes(), vocab.special_ids(), vocab.fingerprint()
        )
    return vocab


def _load_tokenizer(tokenizer_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path)


def _rust_core(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` under a fast Hugging Face tokenizer (``None`` otherwise):
    its ``encode`` is the one ``transformers`` calls, without the Python around it."""
    if isinstance(tokenizer, StoredTokenizer):
        return tokenizer.backend_tokenizer
    if not is_fast_hf(tokenizer):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)


def is_fast_hf(tokenizer: Any) -> bool:
    """A Hugging Face fast tokenizer (vLLM wraps them in subclasses; Mistral's is not one)."""
    if tokenizer is None:
        return False
    from transformers import PreTrainedTokenizerFast

    return isinstance(tokenizer, PreTrainedTokenizerFast)
