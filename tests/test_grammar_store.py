"""The compiled-grammar store: admission compiles once, every other process loads.

Two ``GrammarCompiler``s over one store stand for the frontend (admission) and the engine
process; the real two-process path (vLLM's API server and engine) is checked in
``test_server.py::test_engine_loads_what_admission_compiled``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from constrained.grammars import GrammarSpec, load_vocab, registry
from constrained.grammars.compiler import GrammarCompiler, default_store
from constrained.grammars.matcher import words_for
from constrained.grammars.store import GrammarStore, store_key
from constrained.settings import reset
from tests.soak import MASKBENCH, SLOW_XGRAMMAR

WIDTH = 151_936
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
)
SPECS = [
    GrammarSpec("json_schema", SCHEMA, backend="llguidance"),
    GrammarSpec("json_schema", SCHEMA, backend="xgrammar"),
    GrammarSpec("json_schema", SCHEMA, backend="outlines"),
    GrammarSpec("regex", r"[a-c]{2}\d{1,3}"),
    GrammarSpec("grammar", 'root ::= "yes" | "no"'),
]


@pytest.fixture(scope="module")
def vocab(tiny_model_dir: str):
    return load_vocab(tiny_model_dir, WIDTH)


@pytest.fixture(autouse=True)
def store_every_compile(request, monkeypatch):
    """Store quick xgrammar compiles too (its backend stores only slow ones), so every
    backend's store path is exercised with the small test schema."""
    if "keeps_store_threshold" in request.keywords:
        return
    quick = dataclasses.replace(registry.get_backend("xgrammar"), store_after_s=0.0)
    monkeypatch.setitem(registry._BY_NAME, "xgrammar", quick)


def masks_along(compiled, text: str, vocab) -> list[torch.Tensor]:
    """The bitmask before each token of ``text`` and after the last one."""
    tokens = vocab.hf_tokenizer.encode(text, add_special_tokens=False)
    matcher = compiled.matcher()
    masks = []
    for token in [*tokens, None]:
        mask = torch.zeros((1, words_for(WIDTH)), dtype=torch.int32)
        matcher.fill(mask, 0)
        masks.append(mask)
        if token is not None:
            assert matcher.consume([token]), text
    return masks


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.backend}")
def test_second_process_loads_and_masks_identically(spec, vocab, tmp_path):
    admission = GrammarCompiler(vocab, store=GrammarStore(tmp_path, 1 << 30))
    engine = GrammarCompiler(vocab, store=GrammarStore(tmp_path, 1 << 30))
    compiled = admission.submit(spec).result()
    loaded = engine.submit(spec).result()
    assert (admission.compiled, admission.loaded) == (1, 0)
    assert (engine.compiled, engine.loaded) == (0, 1)
    assert loaded.backend == compiled.backend
    text = {"json_schema": '{"name":"ab","n":12}', "regex": "ab12", "grammar": "yes"}[spec.kind]
    for before, after in zip(
        masks_along(compiled, text, vocab), masks_along(loaded, text, vocab), strict=True
    ):
        assert torch.equal(before, after)


def test_another_spec_or_tokenizer_is_another_entry(vocab, tiny_model_dir, tmp_path):
    store = GrammarStore(tmp_path, 1 << 30)
    GrammarCompiler(vocab, store=store).submit(SPECS[1]).result()
    flexible = GrammarSpec("json_schema", SCHEMA, backend="xgrammar", whitespace="flexible")
    engine = GrammarCompiler(vocab, store=store)
    engine.submit(flexible).result()
    assert (engine.compiled, engine.loaded) == (1, 0)
    wider = load_vocab(tiny_model_dir, WIDTH + 64)  # another logits width: another tokenizer
    assert wider.fingerprint() != vocab.fingerprint()
    other = GrammarCompiler(wider, store=store)
    other.submit(SPECS[1]).result()
    assert (other.compiled, other.loaded) == (1, 0)
    assert len(store.entries()) == 3


def stored_file(store: GrammarStore) -> Path:
    (entry,) = store.entries()
    return Path(entry.path)


@pytest.mark.parametrize(
    "damage",
    ["flip a payload byte", "truncate", "garbage header", "another key's file"],
)
def test_a_damaged_entry_is_recompiled_never_trusted(damage, vocab, tmp_path):
    store = GrammarStore(tmp_path, 1 << 30)
    spec = SPECS[1]
    reference = GrammarCompiler(vocab, store=store).submit(spec).result()
    path = stored_file(store)
    data = bytearray(path.read_bytes())
    if damage == "flip a payload byte":
        data[-10] ^= 0x55
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage header":
        data = b"not json\n" + data.partition(b"\n")[2]
    else:  # a whole, intact file, but stored under this key by mistake
        header, _, payload = bytes(data).partition(b"\n")
        fields = json.loads(header)
        fields["key"] = "0" * 64
        data = json.dumps(fields).encode() + b"\n" + payload
    path.write_bytes(bytes(data))
    key = path.name.split(".")[0]
    assert store.load(key) is None and not path.exists()  # refused and deleted
    path.write_bytes(bytes(data))
    engine = GrammarCompiler(vocab, store=store)
    compiled = engine.submit(spec).result()
    assert (engine.compiled, engine.loaded) == (1, 0)
    for before, after in zip(
        masks_along(reference, '{"name":"a","n":1}', vocab),
        masks_along(compiled, '{"name":"a","n":1}', vocab),
        strict=True,
    ):
        assert torch.equal(before, after)
    # the recompiled grammar replaced the damaged file: the next process loads it
    third = GrammarCompiler(vocab, store=store)
    third.submit(spec).result()
    assert (third.compiled, third.loaded) == (0, 1)


def test_a_payload_the_backend_cannot_read_is_recompiled(vocab, tmp_path):
    store = GrammarStore(tmp_path, 1 << 30)
    GrammarCompiler(vocab, store=store).submit(SPECS[1]).result()
    key = Path(stored_file(store)).name.split(".")[0]
    store.save(key, "xgrammar", b"{intact checksum, not a grammar")
    engine = GrammarCompiler(vocab, store=store)
    engine.submit(SPECS[1]).result().matcher()
    assert (engine.compiled, engine.loaded) == (1, 0)


def test_concurrent_writers_leave_whole_files(tmp_path):
    store = GrammarStore(tmp_path, 1 << 30)
    payloads = {f"{i:064x}": os.urandom(200_000) for i in range(8)}

    def write(key: str) -> None:
        for _ in range(5):
            store.save(key, "xgrammar", payloads[key])

    threads = [threading.Thread(target=write, args=(k,)) for k in payloads for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key, payload in payloads.items():
        assert store.load(key) == ("xgrammar", payload)
    assert len(store.entries()) == len(payloads)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".tmp-")]


def test_bounded_least_recently_used_go_first(tmp_path):
    store = GrammarStore(tmp_path, max_bytes=1_000_000)
    keys = [store_key("spec", str(i)) for i in range(6)]
    for i, key in enumerate(keys[:4]):
        assert store.save(key, "llguidance", bytes([i]) * 200_000)
        os.utime(store._path(key), (1000 + i, 1000 + i))  # distinct ages
    assert store.load(keys[0]) is not None  # a hit: now the most recently used
    store.save(keys[4], "llguidance", b"x" * 200_000)
    store.save(keys[5], "llguidance", b"y" * 200_000)
    kept = {key for key in keys if store.load(key) is not None}
    assert keys[0] in kept and keys[1] not in kept
    assert sum(e.stat().st_size for e in store.entries()) <= 1_000_000
    assert not store.save(store_key("big"), "llguidance", b"z" * 300_000)  # over a quarter


def test_store_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", "off")
    reset()
    assert default_store() is None
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", str(tmp_path / "g"))
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE_MB", "7")
    reset()
    store = default_store()
    assert store.directory == tmp_path / "g" and store.max_bytes == 7 * 1024 * 1024
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE_MB", "lots")
    reset()
    with pytest.raises(ValueError, match="CONSTRAINED_GRAMMAR_STORE_MB"):
        default_store()
    monkeypatch.undo()
    reset()


@pytest.mark.keeps_store_threshold
def test_xgrammar_stores_slow_compiles_only(vocab, tmp_path):
    """A quick xgrammar compile is cheaper to repeat than to serialize (its JSON can be tens of
    MB): not stored. A slow one is stored, and the engine's load is much quicker.

    "Quick" is a measured time, so the quick case runs under a threshold no compile of the
    small schema reaches on any machine (a slow CI machine took 0.25 s for it); the slow case
    keeps xgrammar's own threshold (the MaskBench schema compiles in seconds)."""
    store = GrammarStore(tmp_path, 1 << 30)
    xgrammar = registry.get_backend("xgrammar")
    assert xgrammar.store_after_s > 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            registry._BY_NAME, "xgrammar", dataclasses.replace(xgrammar, store_after_s=60.0)
        )
        GrammarCompiler(vocab, store=store).submit(SPECS[1]).result()
    assert store.entries() == []
    slow_schema = json.loads((MASKBENCH / SLOW_XGRAMMAR).read_text())["schema"]
    slow = GrammarSpec("json_schema", json.dumps(slow_schema), backend="xgrammar")
    GrammarCompiler(vocab, store=store).submit(slow).result()
    assert len(store.entries()) == 1
    engine = GrammarCompiler(vocab, store=store)
    engine.submit(slow).result()
    engine.submit(SPECS[1]).result()
    assert (engine.compiled, engine.loaded) == (1, 1)


def test_without_a_store_each_process_compiles(vocab):
    first, second = GrammarCompiler(vocab), GrammarCompiler(vocab)
    first.submit(SPECS[0]).result()
    second.submit(SPECS[0]).result()
    assert (first.compiled, second.compiled, second.loaded) == (1, 1, 0)


def test_a_save_scans_the_store_only_when_it_may_pass_its_bound(tmp_path, monkeypatch):
    """A prune lists every stored file; a process keeps count of what it saved since its
    last prune, and prunes when that may pass the bound (or an eighth of it was written,
    for other processes' files), not after every save."""
    store = GrammarStore(tmp_path, max_bytes=1_000_000)
    scans = []
    real = store.entries
    monkeypatch.setattr(store, "entries", lambda: scans.append(1) or real())
    for i in range(100):  # 100 x 1 kB: under an eighth of the bound in all
        assert store.save(store_key("small", str(i)), "llguidance", b"s" * 1000)
    assert len(scans) == 1  # the first save's: what was stored before is not known
    for i in range(10):  # 10 x 200 kB: past the bound, and an eighth each
        assert store.save(store_key("large", str(i)), "llguidance", b"l" * 200_000)
        assert sum(e.stat().st_size for e in real()) <= 1_000_000
    assert len(scans) == 11


def test_closing_tables_walked_once_are_read_by_the_other_process(vocab, tmp_path, monkeypatch):
    """Admission walks a grammar's root witness (its budget check), a worker its rise; each
    is kept beside the compiled grammar, and the other process reads it instead of walking
    (the same walk gives the same result). A kept table that does not read as one is
    walked again."""
    from constrained.grammars import closing_tables

    walks = []
    real = closing_tables.find_witness
    monkeypatch.setattr(
        closing_tables, "find_witness", lambda *a, **k: walks.append(1) or real(*a, **k)
    )
    store = GrammarStore(tmp_path, max_bytes=64 << 20)
    spec = GrammarSpec("json_schema", SCHEMA, backend="llguidance")
    grammars = []  # (the tables hold their grammar weakly)

    def tables_in_a_new_process():
        grammars.append(GrammarCompiler(vocab, store=store).compile(spec))
        return closing_tables.tables_of(grammars[-1])

    front = tables_in_a_new_process()
    witness = front.root_witness(vocab)
    assert witness and len(walks) == 1
    engine = tables_in_a_new_process()
    assert engine.root_witness(vocab) == witness and len(walks) == 1  # read, not walked
    rise = engine.rise(vocab)
    walked = len(walks)
    third = tables_in_a_new_process()
    assert (third.root_witness(vocab), third.rise(vocab)) == (witness, rise)
    assert len(walks) == walked
    # A damaged or foreign entry: walked again, to the same result.
    key = third.kept[1]
    store.save(store_key(key, "root_witness"), "closing", b'{"not": "a witness"}')
    fourth = tables_in_a_new_process()
    assert fourth.root_witness(vocab) == witness and len(walks) == walked + 1
