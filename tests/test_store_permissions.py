"""The compiled-grammar store is private: created 0700, a directory others can write to (or a
link, or another user's) refused naming ``CONSTRAINED_GRAMMAR_STORE``, and no link inside it
followed. No engine."""

from __future__ import annotations

import os
import stat

import pytest

from constrained.grammars.store import GrammarStore, StoreError, store_key

KEY = store_key("a", "b")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_created_private_with_private_entries(tmp_path):
    store = GrammarStore(tmp_path / "deep" / "grammars", 1 << 20)
    assert _mode(store.directory) == 0o700
    assert store.save(KEY, "llguidance", b"payload")
    assert store.load(KEY) == ("llguidance", b"payload")
    path = store._path(KEY)
    assert _mode(path.parent) == 0o700 and _mode(path) == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(StoreError, match=r"CONSTRAINED_GRAMMAR_STORE.*writable by group or others"):
        GrammarStore(shared, 1 << 20)
    shared.chmod(0o700)
    GrammarStore(shared, 1 << 20)  # fixed: accepted


def test_a_link_as_the_store_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StoreError, match="symbolic link"):
        GrammarStore(tmp_path / "link", 1 << 20)


def test_another_users_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(StoreError, match="owned by another user"):
        GrammarStore(tmp_path, 1 << 20)


def test_links_inside_are_never_followed(tmp_path):
    store = GrammarStore(tmp_path / "store", 1 << 20)
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = outside / f"{KEY}.grammar"
    planted.write_bytes(b"planted")
    # A link in place of a subdirectory: not read, not written through.
    (store.directory / KEY[:2]).symlink_to(outside, target_is_directory=True)
    assert store.load(KEY) is None
    assert not store.save(KEY, "llguidance", b"payload")
    assert planted.read_bytes() == b"planted"
    assert store.entries() == []
    # A link in place of a file: not read, not pruned through.
    os.unlink(store.directory / KEY[:2])
    (store.directory / KEY[:2]).mkdir(mode=0o700)
    store._path(KEY).symlink_to(planted)
    assert store.load(KEY) is None
    assert store.entries() == []
    store.prune()
    assert planted.exists()


def test_the_setting_off_and_the_default_in_the_users_cache(monkeypatch, tmp_path):
    from constrained.settings import _from_environment

    monkeypatch.delenv("CONSTRAINED_GRAMMAR_STORE", raising=False)
    monkeypatch.delenv("CONSTRAINED_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _from_environment().grammar_store == tmp_path / "constrained" / "grammars"
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", "off")
    assert _from_environment().grammar_store is None


def test_a_refused_store_is_a_400_naming_the_setting_at_admission(tmp_path, monkeypatch):
    """Admission answers with the refusal (the request's error), not a crash."""
    from constrained.grammars.compiler import default_store
    from constrained.settings import reset

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", str(shared))
    reset()
    try:
        with pytest.raises(StoreError, match="CONSTRAINED_GRAMMAR_STORE"):
            default_store()
    finally:
        monkeypatch.undo()
        reset()
