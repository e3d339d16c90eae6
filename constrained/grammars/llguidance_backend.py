"""llguidance: JSON schemas, regexes, Lark/GBNF grammars and structural tags; refuses what it
cannot enforce.

Its contract: it refuses, itself and by name, every JSON-schema keyword it does not implement
(``Unimplemented keys: ["not"]``), so it needs no allow-list (the JSON-Schema-Test-Suite and
MaskBench found nothing it accepts wrongly); ``auto`` tries it first and names the keyword
from its refusal. ``pattern`` is ECMA-262, translated by llguidance; the ``regex`` option is
Rust's ``regex`` syntax. A structural tag is written as Lark (``structural_tag_lark``) when
it is made of text, JSON and their combinations (the parts vLLM's JSON-style tool calls use);
its other parts (free text, triggers, XML-style parameters, regexes, grammars) are refused
here, and xgrammar compiles them. It compiles in milliseconds where xgrammar takes tens (a
hermes ``required`` tag over two Glaive tools: about 6 ms against 6-50 ms, one 313 ms), so a
new tool set's rows never wait for their compile; its matchers build masks as they go.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.errors import GrammarError
from constrained.grammars.backend import Backend, library_version
from constrained.grammars.matcher import Matcher
from constrained.grammars.structural_tag import SCHEMA_FORMATS, check_json_part, literals
from constrained.helper_cpus import built_off_compute
from constrained.schema.rewrite import first_enforced
from constrained.schema.user_input import close_objects

if TYPE_CHECKING:
    import torch

    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

NAME = "llguidance"
_EXECUTOR: Any = None


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for a spec (no tokenizer needed)."""
    import llguidance
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if spec.kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(spec.source, overrides=json_options(spec))
        except ValueError as exc:
            raise GrammarError(NAME, str(exc)) from None
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.source)
    try:
        return llguidance.grammar_from("lark", any_to_lark(spec.source))
    except Exception as exc:  # the GBNF converter raises its own error types
        raise GrammarError(NAME, f"grammar does not parse: {exc}") from None


def json_options(spec: GrammarSpec) -> dict[str, Any]:
    """llguidance's JSON options (``x-guidance``) for the spec's whitespace."""
    if spec.whitespace == "compact":
        return {"whitespace_flexible": False}
    ws = rf"[ \n\t]{{0,{spec.max_whitespace}}}"  # only after separators, and bounded
    return {"whitespace_flexible": False, "item_separator": "," + ws, "key_separator": ":" + ws}


def structural_tag_lark(spec: GrammarSpec, vocab: Vocab) -> str:
    """The Lark grammar of a structural tag (``structural_tag.py``) made of ``const_string``,
    ``json_schema`` (JSON style), ``sequence``, ``or``, ``tag`` and ``tags_with_separator``
    parts, each with xgrammar's meaning, but for one thing: each literal and each JSON value
    is a lexeme of llguidance's greedy lexer, so where one part's text could run on into the
    next (an integer then the literal ``5``) llguidance keeps the longer reading only; no
    text it allows is invalid, and vLLM's tool-call tags have no such seam. Each schema
    inside is held as a ``json_schema`` is on llguidance (as written, else rewritten; closed
    if asked; the spec's whitespace, after separators only). A special token whose text a
    literal spells may be written as itself (``<[id]>``) there, and nowhere else.

    Raises:
        GrammarError: a part of another kind (xgrammar compiles those), or a schema inside
            that llguidance would not enforce (naming its keyword).
    """
    tag = json.loads(spec.source)
    writer = _LarkWriter(spec, vocab, vocab.specials_in(literals(tag)))
    top = writer.rule(tag["format"], "/format")
    return "\n".join([f"start: {top}", *writer.rules])


class _LarkWriter:
    """A structural tag's parts as Lark rules (``structural_tag_lark``), one rule a part."""

    def __init__(self, spec: GrammarSpec, vocab: Vocab, written: frozenset[int]) -> None:
        self.spec = spec
        self.rules: list[str] = []
        self.specials = {vocab.tokenizer.convert_ids_to_tokens(i): i for i in written}
        by_length = sorted(self.specials, key=len, reverse=True)
        self.split = re.compile("|".join(map(re.escape, by_length)))

    def text(self, value: str) -> str:
        """A literal, each special token's text in it also written as that token; escaped to
        ASCII (Lark's lexer refuses a raw DEL)."""
        if not self.specials:
            return json.dumps(value)
        pieces, at = [], 0
        for found in self.split.finditer(value):
            pieces.append(json.dumps(value[at : found.start()]))
            pieces.append(f"({json.dumps(found.group())} | <[{self.specials[found.group()]}]>)")
            at = found.end()
        pieces.append(json.dumps(value[at:]))
        return " ".join(p for p in pieces if p != '""') or '""'

    def rule(self, node: dict[str, Any], where: str) -> str:
        """The name of a new rule for ``node`` (its parts' rules after it)."""
        index = len(self.rules)
        self.rules.append("")  # its place, before its parts' rules
        self.rules[index] = f"part{index}: {self.body(node, where)}"
        return f"part{index}"

    def body(self, node: dict[str, Any], where: str) -> str:
        kind = node.get("type")
        if kind == "const_string":
            return self.text(node["value"])
        if kind in SCHEMA_FORMATS:
            return "%json " + _schema_part(node, f"{where}/json_schema", self.spec)
        if kind in ("sequence", "or"):
            parts = enumerate(node["elements"])
            elements = [self.rule(e, f"{where}/elements/{i}") for i, e in parts]
            return (" " if kind == "sequence" else " | ").join(elements) or '""'
        if kind == "tag":
            ends = node["end"] if isinstance(node["end"], list) else [node["end"]]
            content = self.rule(node["content"], f"{where}/content")
            return f"{self.text(node['begin'])} {content} ({' | '.join(map(self.text, ends))})"
        if kind == "tags_with_separator":
            tags = [self.rule(t, f"{where}/tags/{i}") for i, t in enumerate(node["tags"])]
            one = f"({' | '.join(tags)})"
            if node.get("stop_after_first"):
                body = one
            elif node["separator"]:
                body = f"{one} ({self.text(node['separator'])} {one})*"
            else:
                body = f"{one}+"
            return body if node.get("at_least_one") else f"({body})?"
        raise GrammarError(NAME, f"the {kind!r} part (at {where}) is compiled by xgrammar")


def _schema_part(node: dict[str, Any], where: str, spec: GrammarSpec) -> str:
    """A JSON part's schema as ``%json`` takes it: enforced here (as written, else
    rewritten), closed if asked, with the spec's whitespace."""
    from llguidance import LLMatcher

    style = node.get("style", "json") if node["type"] == "json_schema" else "qwen_xml"
    if style != "json":
        raise GrammarError(NAME, f"the {style!r} style (at {where}) is compiled by xgrammar")
    check_json_part(node, where, spec, NAME)
    options = json_options(spec)

    def enforced(source: str) -> str:
        try:
            grammar = LLMatcher.grammar_from_json_schema(source, overrides=options)
        except ValueError as exc:
            error: str | None = str(exc)
        else:
            error = LLMatcher.validate_grammar(grammar, None)
        if error:
            refused = GrammarError(NAME, f"the schema at {where}: {_short(error)}")
            refused.keyword = refused_keyword(refused)
            raise refused
        return source

    source = first_enforced(json.dumps(node["json_schema"], ensure_ascii=False), enforced)
    if spec.close_objects and isinstance(node["json_schema"], dict):
        try:
            source = close_objects(source)
        except ValueError as exc:
            raise GrammarError(NAME, f"{where}: {exc}", keyword="allOf") from None
    schema = json.loads(source)
    if schema is False:
        raise GrammarError(NAME, f"the schema at {where} allows no value")
    if schema is True:
        schema = {}
    return json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


class LLGuidanceGrammar:
    """A checked llguidance grammar text; matchers are built from it per request."""

    backend = NAME
    history = False  # rows are the grammar state's (backend.CompiledGrammar)

    def __init__(self, text: str, vocab: Vocab) -> None:
        self.vocab = vocab
        self.text = text

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self)


def compile_grammar(spec: GrammarSpec, vocab: Vocab) -> LLGuidanceGrammar:
    """The checked grammar of ``spec``; raises ``GrammarError`` with llguidance's reason."""
    from llguidance import LLMatcher

    if spec.kind == "structural_tag":
        import llguidance

        lark = structural_tag_lark(spec, vocab)
        try:
            text = llguidance.grammar_from("lark", lark)
        except Exception as exc:  # (a lone surrogate in a literal: UnicodeEncodeError)
            raise GrammarError(NAME, f"the tag does not compile: {exc}") from None
    else:
        text = grammar_text(spec)
    if spec.kind not in ("grammar", "structural_tag"):
        error = LLMatcher.validate_grammar(text, None)
        if error:
            raise GrammarError(NAME, _short(error))
        return LLGuidanceGrammar(text, vocab)
    tokenizer = vocab.llguidance()
    error = LLMatcher.validate_grammar(text, tokenizer)
    if error:
        raise GrammarError(NAME, _short(error))
    probe = LLMatcher(tokenizer, text, log_level=0)  # token names resolve here
    if probe.is_error():
        raise GrammarError(NAME, _short(probe.get_error()))
    return LLGuidanceGrammar(text, vocab)


class LLGuidanceMatcher(Matcher):
    """One request's llguidance matcher, held to the contract's ``rollback``.

    llguidance 1.7.6 breaks that promise in one way: a mask computed at a state that is
    then rolled back leaves state behind, and a later mask at another state can leave out
    tokens its own ``consume`` takes (``{"`` ``Log`` ``Directory`` ``":"``, a mask, a
    rollback of the four, then ``"Name":"+``: the 49 tokens ``",`` ``]",``... that close
    the string are missing; a fresh matcher at that state allows them). So a mask is
    computed on the matcher itself only where its tokens are committed (no look-ahead
    above them: ``ahead``), and on a copy (``deep_copy``, about 2 us) inside a look-ahead
    (closing's walks, draft rows). A rollback of committed tokens below the last state
    masked in place rebuilds the matcher from an unmasked copy of its start and the tokens
    that stay (``tests/test_llguidance_rollback.py``).

    It does not read bytes alone (``reads_bytes`` is ``False``): where text is forced it
    allows its own spelling of it (``{"`` at the start of ``{"name"``, not ``{``), so a
    completion spelt otherwise may be refused.
    """

    def __init__(self, grammar: LLGuidanceGrammar) -> None:
        from llguidance import LLMatcher

        self.eos = grammar.vocab.eos_token_id
        self.inner = LLMatcher(grammar.vocab.llguidance(), grammar.text, log_level=0)
        self.error: str | None = self.inner.get_error() or None
        self._start = self.inner.deep_copy()  # never masked: what a rebuild starts from
        self._tokens: list[int] = []  # every token the matcher holds, in order
        self.ahead = 0  # of them, the last ones a look-ahead took (``try_consume``)
        self._masked = 0  # tokens held when a mask was last computed in place

    def consume(self, tokens: Sequence[int]) -> bool:
        tokens = list(tokens)
        # llguidance stops by itself when nothing can follow; the EOS sampled then is fine.
        if tokens and tokens[-1] == self.eos and self.inner.is_stopped():
            tokens.pop()
        if self.error is None and tokens:
            if not self.inner.consume_tokens(tokens):
                self.error = _short(self.inner.get_error()) or "token refused"
            else:
                self._tokens += tokens
                if self.ahead:  # on top of a look-ahead: undone with it
                    self.ahead += len(tokens)
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        if self.error is not None:
            return 0
        tokens = list(tokens)
        taken = self.inner.try_consume_tokens(tokens)
        self._tokens += tokens[:taken]
        self.ahead += taken
        return taken

    def _masker(self) -> Any:
        """The llguidance matcher to compute this state's mask on: itself where every token
        it holds is committed, else a copy (see the class's docstring)."""
        if self.ahead:
            return self.inner.deep_copy()
        self._masked = len(self._tokens)
        return self.inner

    def completes(self, tokens: Sequence[int]) -> bool:
        """The tokens and then end-of-sequence validated without committing them: exactly
        ``try_consume`` + ``accepts_end`` + ``rollback``, without the work llguidance does
        when a consumed token ends the grammar (about 35 us against 2 us)."""
        tokens = list(tokens)
        if self.error is not None:
            return False
        if not tokens:  # a stopped matcher (the grammar ended) validates no end-of-sequence
            return self.accepts_end()
        if self.eos in tokens:  # never in closing's checks; the generic path says
            return super().completes(tokens)
        return self.inner.validate_tokens([*tokens, self.eos]) == len(tokens) + 1

    def accepted(self, tokens: Sequence[int]) -> int:
        """``try_consume`` + ``rollback`` without committing (``validate_tokens``); tokens
        with end-of-sequence take the generic path, as in ``completes``."""
        tokens = list(tokens)
        if self.error is not None:
            return 0
        if self.eos in tokens:
            return super().accepted(tokens)
        return self.inner.validate_tokens(tokens)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """``llguidance.torch.fill_next_token_bitmask`` without its slicing and checks for a
        host int32 row, every caller's (half of a walk step's fill). A stopped or failed
        matcher writes an EOS-only mask by itself."""
        import torch

        masker = self._masker()
        if not bitmask.is_cpu or bitmask.dtype != torch.int32 or bitmask.stride(1) != 1:
            import llguidance.torch  # not a host int32 row: the checked path says why

            llguidance.torch.fill_next_token_bitmask(masker, bitmask, row)
            return
        offset = 4 * bitmask.stride(0) * row
        masker.unsafe_compute_mask_ptr(bitmask.data_ptr() + offset, 4 * bitmask.shape[1])

    def rollback(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        committed = num_tokens - min(num_tokens, self.ahead)
        self.ahead -= num_tokens - committed
        del self._tokens[max(len(self._tokens) - num_tokens, 0) :]
        if committed and len(self._tokens) < self._masked and self.error is None:
            self._rebuild()  # a mask was computed in place above where it now is
        else:
            self.inner.rollback(num_tokens)

    def _rebuild(self) -> None:
        """The matcher afresh (an unmasked copy of its start) over the tokens that stay."""
        self.inner = self._start.deep_copy()
        if self._tokens and not self.inner.consume_tokens(self._tokens):
            self.error = _short(self.inner.get_error()) or "token refused"
        self._masked = 0

    def accepts_end(self) -> bool:
        return self.error is None and self.inner.is_accepting()

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's fast-forward tokens)."""
        return list(self.inner.compute_ff_tokens()) if self.error is None else []

    def forced_bytes(self) -> bytes:
        """The bytes the grammar forces next, whichever tokens write them (llguidance's
        fast-forward bytes: ``"`` after a string at its ``maxLength``, though ``"``, ``",``
        and ``"]`` are all tokens that may write it)."""
        return bytes(self.inner.compute_ff_bytes()) if self.error is None else b""

    @classmethod
    def fill_many(cls, pairs: Sequence[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        """Fill several rows in llguidance's thread pool, without the GIL; one row here (the
        pool's round trip costs more than one row's mask)."""
        global _EXECUTOR
        import llguidance
        import llguidance.torch

        if len(pairs) == 1:
            super().fill_many(pairs, bitmask)
            return
        if _EXECUTOR is None:  # its threads off the compute cores, whoever asks first
            _EXECUTOR = built_off_compute(llguidance.LLExecutor)
        inner = [(m._masker(), row) for m, row in pairs]  # type: ignore[attr-defined]
        llguidance.torch.fill_next_token_bitmask_par(_EXECUTOR, inner, bitmask)


def _short(message: str) -> str:
    """llguidance errors can carry a long parser-state dump after the first line."""
    lines = message.strip().splitlines()
    return lines[0][:500] if lines else ""


def refused_keyword(error: GrammarError) -> str | None:
    """The JSON-schema keyword a refusal names (``Unimplemented keys: ["not"]``), or the one
    our own layer named (``GrammarError.keyword``: an array check it cannot follow)."""
    if error.keyword is not None:
        return error.keyword
    found = re.search(r'[Uu]nimplemented keys?:?\s*\[?"([^"]+)"', str(error))
    return found.group(1) if found else None


BACKEND = Backend(
    NAME,
    compile_grammar,
    version=library_version("llguidance"),
    dump=lambda grammar: grammar.text.encode(),
    load=lambda payload, vocab: LLGuidanceGrammar(payload.decode(), vocab),
    refused_keyword=refused_keyword,
    kinds=frozenset({"json_schema", "regex", "grammar", "structural_tag"}),
)
