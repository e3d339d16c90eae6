"""The tokenizer's record (``grammars/vocab_record.py``): a process without the tokenizer
builds the same ``Vocab`` from it as a process that has the tokenizer.

A ``Vocab`` built from the tokenizer saves its record in the store; one built from the record
must give the same ids, bytes, specials, fingerprint and masks, on both embedded tokenizers.
The engine's worker building from it is checked in
``test_server.py::test_engine_loads_what_admission_compiled``.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil

import pytest
import torch

from constrained.grammars import GrammarSpec, compile_now, vocab_record
from constrained.grammars.matcher import words_for
from constrained.grammars.store import GrammarStore, store_key
from constrained.grammars.vocab import Vocab, _build, load_vocab
from constrained.grammars.vocab_record import RecordPlace, StoredTokenizer, record_key
from constrained.tiny_model import VOCABS, build_tiny_model

# Texts a tokenizer may split differently: accents, combining marks, emoji, escapes,
# special-token text, digits, whitespace runs.
ALPHABET = [" ", "{", "}", '"', ":", ",", "a", "Z", "é", "e\u0301", "€", "😀", "\n", "\\u0041",
            "<|im_end|>", "<think>", "1", "23", "\t  ", "ß", "ĳ", "中文", "…"]  # fmt: skip
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "tags": {"type": "array"}},
    "required": ["name"],
}


def at(store: GrammarStore) -> RecordPlace:
    return RecordPlace(lambda: store)


@pytest.fixture(scope="module", params=sorted(VOCABS))
def tokenizer_dir(request, tmp_path_factory) -> tuple[str, int]:
    """A copy of the tiny model's directory (a file of it is changed below)."""
    copy = tmp_path_factory.mktemp(f"tok-{request.param}") / "model"
    shutil.copytree(build_tiny_model(request.param), copy)
    return str(copy), VOCABS[request.param].logits_width


@pytest.fixture(scope="module")
def both(tokenizer_dir, tmp_path_factory) -> tuple[Vocab, Vocab]:
    """The vocabulary built from the tokenizer (saving its record), then from the record."""
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path_factory.mktemp("store"), 1 << 30)
    real = _build(path, width, None, load_vocab(path, width).hf_tokenizer, None, at(store))
    stored = _build(path, width, None, None, None, at(store))
    return real, stored


def test_the_record_stands_in_for_the_tokenizer(both) -> None:
    real, stored = both
    assert not real.from_record and stored.from_record
    assert isinstance(stored.tokenizer, StoredTokenizer)
    assert (stored.width, stored.eos_token_id) == (real.width, real.eos_token_id)
    assert stored.token_bytes() == real.token_bytes()
    assert stored.special_ids() == real.special_ids()
    assert stored.fingerprint() == real.fingerprint()
    real_added = {i: (t.content, t.special) for i, t in real.tokenizer.added_tokens_decoder.items()}
    assert {i: (t.content, t.special)
            for i, t in stored.tokenizer.added_tokens_decoder.items()} == real_added  # fmt: skip
    assert len(stored.tokenizer) == len(real.tokenizer)
    ids = range(0, len(real.tokenizer), 97)
    assert [stored.tokenizer.convert_ids_to_tokens(i) for i in ids] == [
        real.tokenizer.convert_ids_to_tokens(i) for i in ids
    ]
    assert stored.tokenizer.get_vocab() == real.tokenizer.get_vocab()


def test_the_record_encodes_as_the_tokenizer(both) -> None:
    real, stored = both
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24)))
        expected = real.hf_tokenizer.encode(text, add_special_tokens=False)
        assert stored.encode(text) == expected, text
        assert stored.tokenizer.encode(text, add_special_tokens=False) == expected, text


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_the_record_masks_as_the_tokenizer(both, backend) -> None:
    """A walk's masks, compiled over each vocabulary, are equal bit for bit."""
    real, stored = both
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), backend=backend)
    matchers = [compile_now(spec, v).matcher() for v in (real, stored)]
    rng = random.Random(1)
    for _ in range(40):
        masks = [torch.zeros((1, words_for(real.width)), dtype=torch.int32) for _ in matchers]
        for matcher, mask in zip(matchers, masks, strict=True):
            matcher.fill(mask, 0)
        assert torch.equal(masks[0], masks[1])
        allowed = (masks[0][0].numpy().view("uint32") != 0).nonzero()[0]
        if not allowed.size or matchers[0].accepts_end():
            break
        word = int(rng.choice(allowed))
        bits = int(masks[0][0, word].numpy().view("uint32"))
        token = word * 32 + rng.choice([b for b in range(32) if bits >> b & 1])
        assert all(m.consume([token]) for m in matchers)


def test_the_served_tokenizer_is_loaded_only_when_read(tokenizer_dir, tmp_path) -> None:
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path, 1 << 30)
    _build(path, width, None, load_vocab(path, width).hf_tokenizer, None, at(store))
    loads = []
    stored = _build(path, width, None, None, lambda: loads.append(1), at(store))
    stored.encode("{}")
    stored.llguidance()
    assert loads == []
    from transformers import PreTrainedTokenizerFast

    # (this finder found none: the tokenizer is loaded from its directory)
    assert isinstance(stored.hf_tokenizer, PreTrainedTokenizerFast)
    assert loads == [1]


def test_a_changed_tokenizer_file_finds_no_record(tokenizer_dir, tmp_path) -> None:
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path, 1 << 30)
    before = record_key(path, width, None)
    _build(path, width, None, load_vocab(path, width).hf_tokenizer, None, at(store))
    assert store.has(before)
    config = pathlib.Path(path, "tokenizer_config.json")
    original = config.read_text()
    try:
        config.write_text(original.replace("}", ', "x-changed": 1}', 1))
        after = record_key(path, width, None)
        assert after != before and not store.has(after)
        assert record_key(path, width + 1, None) != before  # another width, another record
        assert record_key(path, width, 0) != before  # another end-of-sequence too
    finally:
        config.write_text(original)
    assert record_key(path, width, None) == before


def test_a_damaged_record_is_never_read(tokenizer_dir, tmp_path) -> None:
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path, 1 << 30)
    _build(path, width, None, load_vocab(path, width).hf_tokenizer, None, at(store))
    key = record_key(path, width, None)
    file = store._path(key)
    data = bytearray(file.read_bytes())
    data[-10] ^= 0xFF
    file.write_bytes(bytes(data))
    vocab = _build(path, width, None, None, None, at(store))  # loads the tokenizer instead
    assert not vocab.from_record
    assert store.has(key)  # and saved the record again, whole
    assert _build(path, width, None, None, None, at(store)).from_record


def test_no_store_or_no_directory_means_the_tokenizer(tokenizer_dir) -> None:
    path, width = tokenizer_dir
    assert not _build(path, width, None, None, None, None).from_record
    assert record_key("no-such-org/no-such-model", width, None) is None


def test_a_truncation_the_saver_had_set_is_not_kept(tokenizer_dir, tmp_path) -> None:
    """vLLM's frontend truncates prompts through the tokenizer it shares with us, and the
    Rust core keeps the last truncation set (``to_str`` writes it): a record's core is read
    without it, or a worker would cut every text it encodes."""
    from transformers import AutoTokenizer

    path, width = tokenizer_dir
    tokenizer = AutoTokenizer.from_pretrained(path)  # (one of its own: changed here)
    tokenizer.backend_tokenizer.enable_truncation(4)
    tokenizer.backend_tokenizer.enable_padding(length=8)
    _build(path, width, None, tokenizer, None, at(store := GrammarStore(tmp_path, 1 << 30)))
    stored = _build(path, width, None, None, None, at(store))
    assert stored.from_record
    text = '{"name": "a longer text than four tokens", "n": 12345}'
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.no_padding()
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert len(expected) > 8
    assert stored.encode(text) == expected
    assert stored.tokenizer.encode(text) == expected


def test_a_record_of_another_tokenizer_is_replaced(tokenizer_dir, tmp_path) -> None:
    """A process with the tokenizer checks the record's fingerprint (a small entry of its
    own) and saves its record again where it differs: a hub cache resolved to another
    snapshot, a file the key does not read."""
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path, 1 << 30)
    real = load_vocab(path, width)
    key = record_key(path, width, None)
    mark = store_key(key, "fingerprint")
    _build(path, width, None, real.hf_tokenizer, None, at(store))
    assert store.load(mark)[1] == real.fingerprint().encode()
    store.save(mark, "vocab", b"another tokenizer's")
    saved = []
    real_save = vocab_record._payload
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vocab_record, "_payload", lambda *a: saved.append(1) or real_save(*a))
        _build(path, width, None, real.hf_tokenizer, None, at(store))
        assert saved == [1] and store.load(mark)[1] == real.fingerprint().encode()
        _build(path, width, None, real.hf_tokenizer, None, at(store))
        assert saved == [1]  # the same tokenizer's: kept


def test_a_record_that_cannot_be_written_or_read_leaves_the_tokenizer(
    tokenizer_dir, tmp_path, monkeypatch
) -> None:
    path, width = tokenizer_dir
    store = GrammarStore(tmp_path, 1 << 30)
    real = load_vocab(path, width).hf_tokenizer

    def refuse(*_: object) -> None:
        raise ValueError("Custom PreTokenizer cannot be serialized")

    monkeypatch.setattr(vocab_record, "_payload", refuse)
    assert not _build(path, width, None, real, None, at(store)).from_record
    assert not store.has(record_key(path, width, None))
    monkeypatch.undo()
    _build(path, width, None, real, None, at(store))
    monkeypatch.setattr(vocab_record, "_read", refuse)
    vocab = _build(path, width, None, None, None, at(store))
    assert not vocab.from_record and vocab.token_bytes() == load_vocab(path, width).token_bytes()


def test_a_store_that_is_not_private_means_no_record(tmp_path, monkeypatch) -> None:
    """The record is an optimisation: a store directory others may write (refused for
    compiles, naming the setting) is not used for it, and the vocabulary is still built."""
    from constrained.admission import _record_store
    from constrained.settings import reset

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", str(shared))
    reset()
    try:
        assert _record_store() is None
    finally:
        monkeypatch.undo()
        reset()
