"""The grammar layer's parts, without compiling anything: the backend registry, each backend's
allow-list refusals, the size guard, the settings it reads, the compile cache and time limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import typing

import pytest

import constrained.settings
from constrained.grammars import GrammarCompiler, GrammarError, GrammarSpec
from constrained.grammars import compiler as compiler_module
from constrained.grammars.auto import compile_with
from constrained.grammars.cache import CompileCache
from constrained.grammars.regex_size import regex_size_problem
from constrained.grammars.registry import BACKEND_NAMES, BACKENDS, get_backend
from constrained.grammars.size_guard import refuse_huge_regexes
from constrained.schema.user_input import schema_text
from constrained.schema.walk import iter_subschemas, resolve_pointer


@pytest.fixture
def env(monkeypatch):
    """Set environment switches for one test; settings are read again before and after."""

    def set_env(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        constrained.settings.reset()

    yield set_env
    monkeypatch.undo()
    constrained.settings.reset()


def test_registry_lists_every_backend_once_in_auto_order():
    assert BACKEND_NAMES == ("auto", "llguidance", "xgrammar", "outlines")
    assert [get_backend(name) for name in BACKEND_NAMES[1:]] == list(BACKENDS)
    with pytest.raises(KeyError, match="no grammar backend 'auto'"):
        get_backend("auto")


def test_options_accept_exactly_the_registered_backends():
    from constrained.options import GrammarBackend

    assert typing.get_args(GrammarBackend) == BACKEND_NAMES


@pytest.mark.parametrize(
    ("backend", "schema", "message"),
    [
        ("xgrammar", {"type": "object", "properties": {"a": {"not": {"multipleOf": 3}}}},
         "xgrammar: does not enforce keyword 'not' (at #/properties/a)"),
        ("xgrammar", {"type": "string", "format": "date-time"},
         "xgrammar: does not enforce keyword 'format' (at #)"),
        ("xgrammar", {"type": "string", "pattern": r"\s+"},
         "xgrammar: does not enforce keyword 'pattern' (at #)"),
        ("outlines", {"type": "array", "prefixItems": [{}]},
         "outlines: does not enforce keyword 'prefixItems' (at #)"),
        ("outlines", {"type": "string", "pattern": r"\d+"},
         "outlines: does not enforce keyword 'pattern' (at #)"),
        ("outlines", {"type": "object", "additionalProperties": {"type": "string"}},
         "outlines: does not enforce keyword 'additionalProperties' (at #)"),
        ("xgrammar", {"properties": {"a": {}}, "required": ["b"]},
         "xgrammar: does not enforce keyword 'required' (at #)"),
        ("outlines", {"properties": {"a": {}}}, "outlines: does not enforce keyword 'properties'"),
    ],
)  # fmt: skip
def test_allow_list_backends_refuse_before_compiling(backend, schema, message):
    spec = GrammarSpec("json_schema", json.dumps(schema), backend)
    with pytest.raises(GrammarError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_with(backend, spec, vocab=None)  # type: ignore[arg-type]


def test_untyped_properties_are_an_object_to_xgrammar_only():
    schema = {"properties": {"a": {"type": "integer"}}}
    assert get_backend("xgrammar").refusal(schema) is None
    assert get_backend("outlines").refusal(schema) == ("properties", "#")
    assert get_backend("llguidance").refusal({"not": {}}) is None  # refuses by itself


def test_xgrammar_strings_of_limited_length_hold_no_raw_control_character(tiny_model_dir):
    """xgrammar 0.2.8 lets a raw tab into a string with minLength / maxLength (invalid JSON);
    our xgrammar grammars do not (such strings take no escapes at all there: stricter)."""
    from constrained.grammars import compile_now, load_vocab

    vocab = load_vocab(tiny_model_dir, 151_936)
    tokenizer = vocab.hf_tokenizer
    for schema in ({"type": "string", "maxLength": 8}, {"type": "string", "minLength": 1}):
        spec = GrammarSpec("json_schema", json.dumps(schema), "xgrammar")
        matcher = compile_now(spec, vocab).matcher()
        assert matcher.try_consume(tokenizer.encode('"a\tb"')) < len(tokenizer.encode('"a\tb"'))
        matcher = compile_now(spec, vocab).matcher()
        assert matcher.consume(tokenizer.encode('"a b"')) and matcher.accepts_end()


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "outlines"])
@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "maxLength": 8}])
def test_json_strings_hold_no_surrogate_bytes(tiny_model_dir, backend, schema):
    """UTF-8 forbids a surrogate's three bytes (``\\xed\\xa1\\x9b``: U+D85B); xgrammar 0.2.8
    lets them into a JSON string (a random walk wrote them into a tool call's argument), our
    xgrammar grammars do not, as llguidance and outlines-core do not. Valid three-byte
    characters, ``\\xed\\x9f\\xbf`` (U+D7FF) among them, stay."""
    from constrained.grammars import compile_now, load_vocab

    vocab = load_vocab(tiny_model_dir, 151_936)
    by_bytes = {piece: token for token, piece in enumerate(vocab.token_bytes()) if piece}
    spec = GrammarSpec("json_schema", json.dumps(schema), backend)
    compiled = compile_now(spec, vocab)

    def accepted(*pieces: bytes) -> bool:
        matcher = compiled.matcher()
        tokens = [by_bytes[piece] for piece in (b'"', *pieces, b'"')]
        return matcher.try_consume(tokens) == len(tokens) and matcher.accepts_end()

    assert not accepted(b"\xed", b"\xa1", b"\x9b")
    assert not accepted(b"\xed", b"\xbf", b"\xbf")
    assert accepted(b"\xed", b"\x9f", b"\xbf")
    assert accepted(b"\xe5", b"\xbb", b"\xba")


def test_llguidance_refusal_names_its_keyword():
    error = GrammarError("llguidance", 'Unimplemented keys: ["not"]')
    assert get_backend("llguidance").refused_keyword(error) == "not"
    assert get_backend("xgrammar").refused_keyword(GrammarError("xgrammar", "x", "if")) == "if"


def test_size_guard_refuses_huge_patterns_for_every_backend():
    refuse_huge_regexes(GrammarSpec("regex", "x{20000}"))
    with pytest.raises(GrammarError, match="20,001 positions"):
        refuse_huge_regexes(GrammarSpec("regex", "x{20001}"))
    schema = {"type": "object", "patternProperties": {"a{30000}": {}}}
    with pytest.raises(GrammarError, match="'pattern' at # unrolls") as info:
        refuse_huge_regexes(GrammarSpec("json_schema", json.dumps(schema), "xgrammar"))
    assert info.value.keyword == "pattern"


def test_regex_size_limit_comes_from_settings(env):
    env("CONSTRAINED_MAX_REGEX_SIZE", "10")
    assert "(CONSTRAINED_MAX_REGEX_SIZE)" in regex_size_problem("x{11}")
    assert regex_size_problem("x{10}") is None
    assert regex_size_problem("x{11}", limit=11) is None


def test_schema_size_limit_comes_from_settings(env):
    env("CONSTRAINED_MAX_SCHEMA_BYTES", "20")
    with pytest.raises(ValueError, match=r"more than 20 \(CONSTRAINED_MAX_SCHEMA_BYTES\)"):
        schema_text({"type": "string", "maxLength": 10})
    assert schema_text({"type": "string"}) == '{"type": "string"}'


def test_schema_walk_pointers():
    schema = {"$defs": {"a/b": {"items": [{"type": "null"}]}}, "$ref": "#/$defs/a~1b"}
    assert [p for p, _ in iter_subschemas(schema)] == ["#", "#/$defs/a~1b", "#/$defs/a~1b/items/0"]
    assert resolve_pointer(schema, "#/$defs/a~1b/items/0") == {"type": "null"}
    assert resolve_pointer(schema, "#/missing") is None


def test_schema_package_imports_no_backend_and_no_vllm():
    """``constrained.schema`` is pure: every module of it imports no backend, vLLM or torch."""
    heavy = ("vllm", "torch", "xgrammar", "llguidance", "outlines_core")
    code = (
        "import sys, pkgutil, importlib, constrained.schema as s\n"
        "for m in pkgutil.iter_modules(s.__path__, 'constrained.schema.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compile_cache_is_lru_and_discards_only_its_own_future():
    from concurrent.futures import Future

    cache = CompileCache(2)
    specs = [GrammarSpec("regex", str(i)) for i in range(3)]
    futures = [Future() for _ in specs]
    assert cache.get_or_start(specs[0], lambda: futures[0]) is futures[0]
    cache.get_or_start(specs[1], lambda: futures[1])
    assert cache.get_or_start(specs[0], lambda: Future()) is futures[0]  # now most recent
    cache.get_or_start(specs[2], lambda: futures[2])  # evicts specs[1]
    assert len(cache) == 2
    assert cache.get_or_start(specs[1], lambda: futures[1]) is futures[1]  # started again
    cache.discard(specs[1], Future())  # not its future: kept
    assert len(cache) == 2
    cache.discard(specs[1], futures[1])
    assert len(cache) == 1


def test_spec_equality_and_hash_are_the_cache_key():
    a = GrammarSpec("json_schema", "{}", "xgrammar", "flexible", 3, True)
    assert a == GrammarSpec("json_schema", "{}", "xgrammar", "flexible", 3, True)
    assert hash(a) == hash(("json_schema", "{}", "xgrammar", "flexible", 3, True))
    assert a != GrammarSpec("json_schema", "{}", "xgrammar", "flexible", 3, False)


def test_compile_time_limit_comes_from_settings(env, monkeypatch):
    release = threading.Event()

    def slow_compile(spec, vocab):
        release.wait(5)
        return "compiled"

    monkeypatch.setattr(compiler_module, "compile_now", slow_compile)
    env("CONSTRAINED_COMPILE_TIMEOUT_S", "0.05")
    compiler = GrammarCompiler(vocab=None, max_workers=1)  # type: ignore[arg-type]
    spec = GrammarSpec("regex", "a+")
    start = time.monotonic()
    with pytest.raises(GrammarError, match=r"longer than 0.05 s \(CONSTRAINED_COMPILE_TIMEOUT_S\)"):
        compiler.compile(spec)
    assert time.monotonic() - start < 2
    assert compiler.cache_len() == 0  # a compile nobody waited for is not cached
    release.set()
    assert compiler.compile(spec, timeout=5) == "compiled"
    assert compiler.cache_len() == 1
