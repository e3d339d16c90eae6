"""A served tokenizer's vocabulary on disk: vLLM's frontend hands it to the engine's workers.

The frontend holds the tokenizer vLLM serves with; an engine worker in a process of its own
(the CPU build's, each tensor- or pipeline-parallel rank's, a Ray worker's) does not, and
loading it again took 1.8-3.5 s (Qwen2, ``transformers`` 5) in the first constrained step.
So the first process that builds a ``Vocab`` from the tokenizer itself saves what every
backend and closing read of it in the compiled-grammar store (``GrammarStore``: private,
checksummed), and a process without the tokenizer builds its ``Vocab`` from that record
(0.75 s) instead of loading it:

- each id's bytes, the special ids, end-of-sequence, the tokenizer's length, its added tokens
  and the ``Vocab`` fingerprint, as the tokenizer gave them;
- the fast tokenizer's Rust core as ``transformers`` built it (``backend_tokenizer.to_str()``,
  not the directory's ``tokenizer.json``, from which ``transformers`` 5 rebuilds a different
  pipeline for Qwen), for ``encode``.

A record is found by ``record_key``: a SHA-256 of the tokenizer directory's files (its Python
files too: remote code), the logits width, the end-of-sequence override, what else the caller
names of the tokenizer (vLLM's tokenizer mode, ``trust_remote_code``), the versions of
``transformers``, ``tokenizers`` and vLLM, and this module's and ``vocab.py``'s code, so a
changed file or version finds no record and the tokenizer is loaded. A process with the
tokenizer also checks the record it finds against its own tables' fingerprint
(``keep_record``) and replaces one of another tokenizer (a hub cache resolved to another
snapshot than the one loaded). A tokenizer not in a local directory or the Hugging Face cache
has no key, and is always loaded. The record is an optimisation: a record that cannot be
written or read leaves the tokenizer loaded, as without it.

Example::

    key = record_key("/models/qwen", 151_936, None)
    keep_record(store, key, tokenizer, vocab.token_bytes(), vocab.special_ids(), fingerprint)
    record = load_record(store, key)        # in a worker: None when absent
    record.tokenizer.encode("{}")           # the served tokenizer's ids
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constrained.grammars.store import GrammarStore, store_key

logger = logging.getLogger(__name__)

RECORD_FORMAT = 1
KIND = "vocab"  # the store's ``backend`` field of a record
# What ``transformers`` reads to build a tokenizer (``config.json``: which class).
TOKENIZER_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


class StoredTokenizer:
    """What a ``Vocab`` reads of a fast Hugging Face tokenizer, from a record: its Rust core
    (``encode``, ``convert_ids_to_tokens``, ``get_vocab`` go through it, as the fast
    tokenizer's do) and the facts the tokenizer gave when the record was saved.

    The core is parsed from its JSON when first read (0.4-1 s: the vocabulary's tables and
    the backends' tokenizers need only the pieces, so a worker's first step does not wait
    for it; the engine's warm-up, ``vocab_tables.build_tables``, reads it)."""

    def __init__(
        self, core_json: str, size: int, eos_token_id: int, special_ids: list[int], added: list
    ) -> None:
        from tokenizers import AddedToken

        self._core_json: str | None = core_json
        self._core: Any = None
        self._core_lock = threading.Lock()
        self._size = size
        self.eos_token_id = eos_token_id
        self.all_special_ids = list(special_ids)
        self.added_tokens_decoder = {
            int(i): AddedToken(content, special=bool(special)) for i, content, special in added
        }

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust core (``tokenizers.Tokenizer``), parsed on first read."""
        if self._core is None:
            with self._core_lock:
                if self._core is None:
                    from tokenizers import Tokenizer

                    core = Tokenizer.from_str(self._core_json)
                    # The saving process's last ``transformers`` call may have left
                    # truncation or padding set on its core (vLLM's frontend truncates
                    # prompts), and ``to_str`` keeps them.
                    core.no_truncation()
                    core.no_padding()
                    self._core, self._core_json = core, None
        return self._core

    def __len__(self) -> int:
        return self._size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self.backend_tokenizer.id_to_token(int(token_id))

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)


@dataclass(frozen=True)
class RecordPlace:
    """Where a tokenizer's record is kept: ``find_store`` (called when a vocabulary is built:
    the store, or ``None``) and what else names the tokenizer (``record_key``'s ``parts``)."""

    find_store: Callable[[], GrammarStore | None]
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Record:
    """A tokenizer's record: a stand-in tokenizer (its ``all_special_ids`` are the ``Vocab``'s
    special ids) and the tables a ``Vocab`` keeps of it."""

    tokenizer: StoredTokenizer
    token_bytes: list[bytes]
    fingerprint: str


def record_key(
    tokenizer_path: str, width: int, eos_token_id: int | None, parts: tuple[str, ...] = ()
) -> str | None:
    """The store key of the record of the tokenizer at ``tokenizer_path`` (a directory, or a
    hub name found in the Hugging Face cache); ``None`` when its files are not found."""
    directory = _tokenizer_dir(tokenizer_path)
    if directory is None or not (directory / "tokenizer.json").is_file():
        return None  # (a slow or non-Hugging-Face tokenizer: loaded, never recorded)
    files = hashlib.sha256()
    for name in [*TOKENIZER_FILES, *sorted(p.name for p in directory.glob("*.py"))]:
        path = directory / name
        if path.is_file():
            files.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return store_key(
        KIND,
        str(RECORD_FORMAT),
        _code_digest(),
        *(_version(p) for p in ("transformers", "tokenizers", "vllm")),
        tokenizer_path,
        str(width),
        str(eos_token_id),
        *parts,
        files.hexdigest(),
    )


def keep_record(
    store: GrammarStore,
    key: str,
    tokenizer: Any,
    token_bytes: list[bytes],
    special_ids: list[int],
    fingerprint: str,
) -> None:
    """Save the record of ``tokenizer`` under ``key`` unless the store holds one with the same
    fingerprint (a small entry of its own says which: checked without reading the record).
    Never raises: a record that cannot be written is logged, and workers load the tokenizer."""
    mark = store_key(key, "fingerprint")
    try:
        found = store.load(mark)
        if found is not None and found[1] == fingerprint.encode() and store.has(key):
            return
        payload = _payload(tokenizer, token_bytes, special_ids, fingerprint)
        if store.save(key, KIND, payload):
            store.save(mark, KIND, fingerprint.encode())
    except Exception as exc:  # (a tokenizer whose core cannot be serialized, a full disk)
        logger.warning("constrained: the tokenizer's record was not saved (%s)", exc)


def _payload(
    tokenizer: Any, token_bytes: list[bytes], special_ids: list[int], fingerprint: str
) -> bytes:
    """The record of a fast Hugging Face ``tokenizer`` and the tables a ``Vocab`` built of it,
    as ``_read`` reads it."""
    core = tokenizer.backend_tokenizer.to_str().encode()
    added = tokenizer.added_tokens_decoder  # (a property that builds a new dict on every read)
    lengths = array("I", map(len, token_bytes)).tobytes()
    pieces = b"".join(token_bytes)
    header = {
        "size": len(tokenizer),
        "eos": int(tokenizer.eos_token_id),
        "special_ids": [int(i) for i in special_ids],
        "added": [[int(i), t.content, bool(t.special)] for i, t in added.items()],
        "fingerprint": fingerprint,
        "width": len(token_bytes),
        "sections": [len(lengths), len(pieces), len(core)],
    }
    return b"\n".join([json.dumps(header).encode(), lengths + pieces + core])


def load_record(store: GrammarStore, key: str) -> Record | None:
    """The record under ``key``; ``None`` if absent, damaged (the store checks it) or not
    readable here (logged)."""
    found = store.load(key)
    if found is None or found[0] != KIND:
        return None
    try:
        return _read(found[1])
    except Exception as exc:  # (another ``tokenizers`` could not parse it: loaded instead)
        logger.warning("constrained: the tokenizer's record was not read (%s)", exc)
        return None


def _read(payload: bytes) -> Record:
    head, _, body = payload.partition(b"\n")
    header = json.loads(head)
    n_lengths, n_pieces, _ = header["sections"]
    lengths = array("I")
    lengths.frombytes(body[:n_lengths])
    pieces = memoryview(body)[n_lengths : n_lengths + n_pieces]
    token_bytes, at = [], 0
    for n in lengths:
        token_bytes.append(bytes(pieces[at : at + n]))
        at += n
    core_json = body[n_lengths + n_pieces :].decode()
    tokenizer = StoredTokenizer(
        core_json, header["size"], header["eos"], header["special_ids"], header["added"]
    )
    return Record(tokenizer, token_bytes, header["fingerprint"])


def _tokenizer_dir(tokenizer_path: str) -> Path | None:
    path = Path(tokenizer_path)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(tokenizer_path, "tokenizer_config.json")
    except Exception:  # not a hub name
        return None
    return Path(found).parent if isinstance(found, str) else None


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _code_digest() -> str:
    """This module's and ``vocab.py``'s code: a record from other code is never read."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("vocab.py", "vocab_record.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()
