"""xgrammar: fast JSON-schema, regex and GBNF masks.

Its contract: xgrammar silently ignores what it does not implement, so a JSON schema may use
only the keywords of ``RULES`` (its allow-list, with the combination rules of
``allow_list``); anything else is refused with the keyword and its JSON pointer before it
compiles. Beyond the shared rules: it checks the formats in ``RULES.formats`` only (its
date / date-time accept 2020-02-30 and 2020-04-31: a ``date`` is rewritten as the exact
pattern, ``schema.rewrite.FORMAT_PATTERNS``; its hostname labels over 63 characters,
its ipv6 "::ffff:192.168.0.01"); its ``\\s`` is ASCII white space only (ECMA-262 adds
U+00A0, U+3000...); an optional group starting with a repetition matches without the rest
of the group (``^(?:a*c)?d$`` takes ``ad``), so such a pattern is refused; it reads an
untyped schema with ``properties`` as an object and one with ``items`` as an array; it
checks ``multipleOf`` of integers only, and ``patternProperties`` only as the sole way to
add keys. It is the backend with a per-separator whitespace cap, and compiles every structural
tag (``structural_tag.py``; ``auto`` takes llguidance first for those of text and JSON, which
compiles them in milliseconds): each schema inside is held to the same rules,
rewritten where that makes it enforceable, closed when asked; JSON content is compact as
xgrammar's own compact JSON grammar (its structural tags take any whitespace in JSON), else
capped per gap (XML-style parameters: at least one character, xgrammar's least); special
tokens whose text a tag writes in its delimiters may be written as themselves.
Its compiles are the slow ones (tens of ms, seconds for large schemas); the stored form is
xgrammar's own ``serialize_json`` (xgrammar checks the tokenizer it is loaded with). Only
compiles of ``STORE_AFTER_S`` or more are stored: for those a load takes about 5% of the
compile (3.8 s -> 0.18 s), but the JSON of a grammar that compiled in 49 ms can be 39 MB and
take 1.5 s to write, so a quick compile is cheaper to repeat in the engine.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.errors import GrammarError
from constrained.grammars.backend import Backend, library_version
from constrained.grammars.matcher import Matcher, fill_only
from constrained.grammars.qwen_xml import SURROGATES, xml_parameters
from constrained.grammars.structural_tag import check_json_part, literals, map_schemas
from constrained.schema.allow_list import AllowList
from constrained.schema.rewrite import first_enforced
from constrained.schema.user_input import close_objects

if TYPE_CHECKING:
    import torch

    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

NAME = "xgrammar"
STORE_AFTER_S = 0.25

# The keywords it enforces (in the combinations ``allow_list`` allows).
KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties",
        "items", "prefixItems", "anyOf", "allOf", "oneOf", "$ref", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minProperties", "maxProperties", "patternProperties",
    }
)  # fmt: skip

RULES = AllowList(
    keywords=KEYWORDS,
    formats=frozenset({"time", "email", "ipv4", "uuid", "uri"}),
    pattern_escapes="sS",
    schema_additional_properties=True,
    infers_container_type=True,
    skips_optional_group_rest=True,
)


class XGrammarGrammar:
    backend = NAME
    history = False  # rows are the grammar state's (backend.CompiledGrammar)

    def __init__(
        self,
        spec: GrammarSpec | None,
        vocab: Vocab,
        compiled: Any = None,
        written: frozenset[int] = frozenset(),
    ) -> None:
        import xgrammar

        self.vocab = vocab
        self.written = written  # special tokens its tokenizer info writes as text
        if spec is None:  # loaded from the store
            self.compiled = compiled
            return
        compiler = xgrammar.GrammarCompiler(vocab.xgrammar(), max_threads=1, cache_enabled=False)
        try:
            if spec.kind == "json_schema":
                grammar = json_grammar(spec.source, spec, strict_mode=spec.close_objects)
                self.compiled = compiler.compile_grammar(grammar)
            elif spec.kind == "structural_tag":
                source, self.written = structural_tag_source(spec, vocab)
                compiler = xgrammar.GrammarCompiler(
                    vocab.xgrammar(self.written), max_threads=1, cache_enabled=False
                )
                self.compiled = compiler.compile_structural_tag(source)
            elif spec.kind == "regex":
                self.compiled = compiler.compile_regex(spec.source)
            else:
                self.compiled = compiler.compile_grammar(spec.source)
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError with the reason
            raise GrammarError(NAME, _clean(str(exc))) from None

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)

    def byte_view(self) -> tuple[list[bytes | None], bool]:
        """What ``XGrammarMatcher.completes`` needs (built once per grammar object): each
        token's bytes as this grammar's tokenizer info has them (``None`` where
        ``accept_token`` does not read bytes: special and stop tokens, empty pieces), and
        whether the grammar is byte-level only (no ``Token(...)``, ``ExcludeToken(...)``,
        ``TokenTagDispatch(...)`` element, no ``max_tokens`` / ``max_chars`` budget on a
        rule: with those, accepting tokens one by one differs from accepting their text)."""
        view = self.__dict__.get("_byte_view")
        if view is None:
            text = str(self.compiled.grammar)
            bytes_only = not any(mark in text for mark in _TOKEN_LEVEL_MARKS)
            view = (_token_pieces(self.vocab, self.written), bytes_only)
            # (token-id elements are special tokens, which write no text: only counts and
            # exclusions by id tell two spellings of one text apart; set first: another
            # thread may read it once the view is there)
            self._reads_bytes = not any(mark in text for mark in _TOKEN_COUNTING_MARKS)
            self._byte_view = view
        return view

    def reads_bytes(self) -> bool:
        """``Matcher.reads_bytes`` for this grammar's matchers (no ``max_tokens`` budget, no
        ``ExcludeToken(...)``), decided with ``byte_view``."""
        self.byte_view()
        return self._reads_bytes


# How xgrammar prints the grammar elements that read token ids or count tokens (conservative:
# a schema whose text merely contains one only loses the fast path of ``completes``).
_TOKEN_LEVEL_MARKS = ("Token(", "max_tokens=", "max_chars=")
# ... and those that tell two spellings of one text apart (``reads_bytes``)
_TOKEN_COUNTING_MARKS = ("max_tokens=", "ExcludeToken(")


def _token_pieces(vocab: Vocab, written: frozenset[int]) -> list[bytes | None]:
    """Each token's bytes in xgrammar's tokenizer info for ``written`` (once per vocabulary);
    ``None`` for the tokens ``accept_token`` refuses or stops on, and for empty pieces."""

    def build() -> list[bytes | None]:
        info = vocab.xgrammar(written)
        pieces: list[bytes | None] = [piece or None for piece in info.decoded_vocab]
        for token in (*info.special_token_ids, *info.stop_token_ids):
            pieces[token] = None
        return pieces

    return vocab._once("xgrammar_pieces" + "".join(f",{i}" for i in sorted(written)), build)


class XGrammarMatcher(Matcher):
    def __init__(self, grammar: XGrammarGrammar) -> None:
        import xgrammar

        self.eos = grammar.vocab.eos_token_id
        self.vocab = grammar.vocab
        self.inner = xgrammar.GrammarMatcher(grammar.compiled)  # rollback is unlimited
        self.error: str | None = None
        self.pieces, self.bytes_only = grammar.byte_view()
        self.reads_bytes = grammar.reads_bytes()

    def consume(self, tokens: Sequence[int]) -> bool:
        for token in tokens:
            if self.error is not None:
                break
            if self.inner.is_terminated():
                self.error = f"token {token} after the end of the grammar"
            elif not self.inner.accept_token(int(token)):
                self.error = f"token {token} not allowed by the grammar"
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        count = 0
        for token in tokens:
            if self.error is not None or self.inner.is_terminated():
                break
            if not self.inner.accept_token(int(token)):
                break
            count += 1
        return count

    def completes(self, tokens: Sequence[int]) -> bool:
        """Exactly ``try_consume`` + ``accepts_end`` + ``rollback``, in fewer calls: the
        tokens' text accepted as one string (``accept_string``, one rollback step: about 3x
        cheaper than token by token) where the grammar is byte-level only, else the tokens
        accepted in a tight loop; the generic path for special or stop tokens (closing's
        checks never have them), an error or a terminated matcher."""
        if not tokens:
            return self.accepts_end()
        inner, pieces = self.inner, self.pieces
        try:
            chunks = [pieces[token] for token in tokens]
        except (IndexError, TypeError):  # not a token id of this vocabulary
            chunks = [None]
        if None in chunks or min(tokens) < 0 or self.error is not None or inner.is_terminated():
            return super().completes(tokens)
        if self.bytes_only:  # one step: accepted whole, or refused with the matcher unchanged
            if not inner.accept_string(b"".join(chunks)):  # type: ignore[arg-type]
                return False
            try:
                return inner.is_completed()
            finally:
                inner.rollback(1)
        accept, count = inner.accept_token, 0
        for token in tokens:  # ordinary tokens: none terminates the matcher
            if not accept(int(token)):
                break
            count += 1
        try:
            return count == len(tokens) and inner.is_completed()
        finally:
            if count:
                inner.rollback(count)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None or self.inner.is_terminated():
            fill_only(bitmask, row, [self.eos])
        else:
            self.inner.fill_next_token_bitmask(bitmask, row)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback(num_tokens)

    def accepts_end(self) -> bool:
        return self.error is None and self.inner.is_completed()

    @classmethod
    def fill_many(cls, pairs: Sequence[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        """Each row as ``fill`` writes it; the live rows in one call of xgrammar's
        ``BatchGrammarMatcher`` instead of a Python call each, in several of its threads
        above ``PARALLEL_ABOVE`` rows, as vLLM's own fill (half the cores, at most 8). On the
        2-core machine (one thread) that saves the per-row calls only: 1,024 3-field rows
        about 25 against 26 ms of CPU, the masks' own work most of it. One row, or a
        bitmask the batch call does not take, is filled row by row."""
        if len(pairs) < 2 or not _batch_fills(bitmask):
            super().fill_many(pairs, bitmask)
            return
        live: list[Any] = []
        rows: list[int] = []
        for matcher, row in pairs:
            inner = matcher.inner  # type: ignore[attr-defined]
            if matcher.error is not None or inner.is_terminated():
                fill_only(bitmask, row, [matcher.eos])  # type: ignore[attr-defined]
            else:
                live.append(inner)
                rows.append(row)
        if live:
            threads = 1 if len(live) <= PARALLEL_ABOVE else FILL_THREADS
            _batch_matcher(threads).batch_fill_next_token_bitmask(live, bitmask, rows)

    def forced(self) -> list[int]:
        """The tokens of the text the grammar forces next (xgrammar's jump-forward string,
        as the tokenizer writes it: the caller keeps the prefix the matcher accepts); none
        known when the forced bytes end inside a UTF-8 character (``(é|ü)+`` forces the
        lead byte 0xC3, which xgrammar's binding fails to return as text)."""
        if self.error is not None or self.inner.is_terminated():
            return []
        try:
            text = self.inner.find_jump_forward_string()
        except UnicodeDecodeError:
            return []
        # the tokenizer's ids, through its Rust core and kept (walks meet the same forced
        # texts again and again)
        return self.vocab.encode(text) if text else []


# vLLM's StructuredOutputManager fills more than 128 rows in a pool of half the cores (at most
# 8 threads), fewer serially; the batched xgrammar fill does the same.
PARALLEL_ABOVE = 128
FILL_THREADS = max(1, min((os.cpu_count() or 1) // 2, 8))
_BATCH = threading.local()  # per filling thread: its BatchGrammarMatcher per thread count


def _batch_matcher(threads: int) -> Any:
    """This thread's ``xgrammar.BatchGrammarMatcher`` of ``threads`` threads."""
    held = _BATCH.__dict__.setdefault("matchers", {})
    batch = held.get(threads)
    if batch is None:
        import xgrammar

        batch = held[threads] = xgrammar.BatchGrammarMatcher(threads)
    return batch


def _batch_fills(bitmask: torch.Tensor) -> bool:
    """Whether ``bitmask`` is what the batch call takes: a contiguous 2-D int32 host
    tensor."""
    import torch

    return (
        bitmask.is_cpu
        and bitmask.dtype == torch.int32
        and bitmask.dim() == 2
        and bitmask.is_contiguous()
    )


def enforced_schema(schema: Any, where: str = "") -> str:
    """``schema`` as JSON text xgrammar enforces: as written, or rewritten exactly
    (``schema_rewrite``).

    Raises:
        GrammarError: naming the keyword (as written) xgrammar would not enforce.
    """

    def enforced(text: str) -> str:
        BACKEND.refuse_unenforced(json.loads(text), where)
        return text

    return first_enforced(json.dumps(schema, ensure_ascii=False), enforced)


JSON_PART = {"type": "json_schema", "style": "json"}  # one JSON value, as the spec writes it
# How a structural tag's schema parts may be written: JSON, and Qwen3.5's XML parameters
# (``qwen_xml.py``: exactly as vLLM's parser reads them back). xgrammar's other XML styles
# (minimax, glm, deepseek ...) are refused: nothing here checks that their parsers read back
# what the grammar allowed.
WRITTEN_STYLES = frozenset({"json", "qwen_xml"})


def style_of(part: dict[str, Any]) -> str:
    """The style a schema part of a structural tag is written in."""
    return "qwen_xml" if part["type"] == "qwen_xml_parameter" else part.get("style", "json")


def check_tool_parameters(schema: Any, style: str) -> None:
    """Refuse a tool's parameters schema this backend would not enforce in ``style``.

    Raises:
        GrammarError: naming the keyword, or the style.
    """
    if style not in WRITTEN_STYLES:
        raise GrammarError(NAME, f"tool calls in the {style!r} style are not enforced here")
    if style == "qwen_xml":
        xml_parameters(
            schema, "", lambda sub, at: {**JSON_PART, "json_schema": enforced_schema(sub, at)}
        )
    else:
        enforced_schema(schema)


def structural_tag_source(spec: GrammarSpec, vocab: Vocab) -> tuple[str, frozenset[int]]:
    """The structural tag xgrammar compiles for ``spec``, and the special tokens its
    delimiters spell (written as their text); every schema inside is checked against
    ``RULES`` (as written, else rewritten), closed if asked, and written as ``json_grammar``
    with the spec's whitespace (or as Qwen's XML parameters, ``qwen_xml``).

    Raises:
        GrammarError: naming a keyword a schema uses that xgrammar would not enforce.
    """

    def part(schema: Any, where: str, node: dict[str, Any]) -> dict[str, Any]:
        style = style_of(node)
        if style not in WRITTEN_STYLES:
            raise GrammarError(NAME, f"the {style!r} style (at {where}) is not enforced here")
        if style == "qwen_xml":
            return xml_parameters(schema, where, lambda sub, at: part(sub, at, JSON_PART))
        text = enforced_schema(schema, f"{where} ")
        if spec.close_objects and isinstance(schema, dict):
            try:
                text = close_objects(text)
            except ValueError as exc:
                raise GrammarError(NAME, f"{where}: {exc}", keyword="allOf") from None
        check_json_part(node, where, spec, NAME)
        return {"type": "grammar", "grammar": json_grammar(text, spec)}

    prepared = map_schemas(json.loads(spec.source), part)
    return json.dumps(prepared, ensure_ascii=False), vocab.specials_in(literals(prepared))


# xgrammar 0.2.8 writes a string's characters as one of these classes: with minLength /
# maxLength the first, which lets a raw tab or other control character through (JSON forbids
# them inside a string), else the second. Both let a surrogate (U+D800-U+DFFF) through, as
# the three bytes ``\xed\xa0``-``\xed\xbf`` that UTF-8 forbids (a random walk wrote
# ``\xed\xa1\x9b`` in a tool call's argument; llguidance and outlines-core refuse them).
_STRING_CHARACTERS = ('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\\\r\\n]')
_JSON_CHARACTERS = '[^\\0-\\x1f\\"\\\\\\r\\n' + SURROGATES + "]"


def json_grammar(text: str, spec: GrammarSpec, strict_mode: bool = False) -> str:
    """xgrammar's grammar (EBNF) of JSON valid against the schema ``text``, with the spec's
    whitespace: compact, or at most ``max_whitespace`` characters a gap; its strings never
    hold a raw control character or a surrogate (``_STRING_CHARACTERS``)."""
    import xgrammar

    if spec.whitespace == "compact" or spec.max_whitespace == 0:
        kwargs: dict[str, Any] = {"any_whitespace": False, "separators": (",", ":")}
    else:
        kwargs = {"any_whitespace": True, "max_whitespace_cnt": spec.max_whitespace}
    grammar = str(xgrammar.Grammar.from_json_schema(text, strict_mode=strict_mode, **kwargs))
    for characters in _STRING_CHARACTERS:
        grammar = grammar.replace(characters, _JSON_CHARACTERS)
    return grammar


def _dump(grammar: XGrammarGrammar) -> bytes:
    """A line naming the special tokens written as text, then xgrammar's own JSON."""
    header = json.dumps(sorted(grammar.written))
    return (header + "\n" + grammar.compiled.serialize_json()).encode()


def _load(payload: bytes, vocab: Vocab) -> XGrammarGrammar:
    import xgrammar

    header, _, body = payload.decode().partition("\n")
    written = frozenset(json.loads(header))
    compiled = xgrammar.CompiledGrammar.deserialize_json(body, vocab.xgrammar(written))
    return XGrammarGrammar(None, vocab, compiled, written)


def _clean(message: str) -> str:
    """First line of an xgrammar error, without its "[time] file.cc:line: " prefix."""
    lines = message.strip().splitlines()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0] if lines else "failed")[:500]


BACKEND = Backend(
    NAME,
    XGrammarGrammar,
    version=library_version("xgrammar"),
    dump=_dump,
    load=_load,
    refusal=RULES.refusal,
    store_after_s=STORE_AFTER_S,
    kinds=frozenset({"json_schema", "regex", "grammar", "structural_tag"}),
)
