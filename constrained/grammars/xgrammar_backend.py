"""xgrammar: fast JSON-schema, regex and GBNF masks.

Its contract: xgrammar silently ignores what it does not implement, so a JSON schema may use
only the keywords of ``RULES`` (its allow-list, with the combination rules of
``allow_list``); anything else is refused with the keyword and its JSON pointer before it
compiles. Beyond the shared rules: it checks the formats in ``RULES.formats`` only (its
date / date-time accept 2020-02-30 and 2020-04-31, its hostname labels over 63 characters,
its ipv6 "::ffff:192.168.0.01"); its ``\\s`` is ASCII white space only (ECMA-262 adds
U+00A0, U+3000...); an optional group starting with a repetition matches without the rest
of the group (``^(?:a*c)?d$`` takes ``ad``), so such a pattern is refused; it reads an
untyped schema with ``properties`` as an object and one with ``items`` as an array; it
checks ``multipleOf`` of integers only, and ``patternProperties`` only as the sole way to
add keys. It is the backend with a per-separator whitespace cap.
Its compiles are the slow ones (tens of ms, seconds for large schemas); the stored form is
xgrammar's own ``serialize_json`` (xgrammar checks the tokenizer it is loaded with). Only
compiles of ``STORE_AFTER_S`` or more are stored: for those a load takes about 5% of the
compile (3.8 s -> 0.18 s), but the JSON of a grammar that compiled in 49 ms can be 39 MB and
take 1.5 s to write, so a quick compile is cheaper to repeat in the engine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.grammars.allow_list import AllowList
from constrained.grammars.backend import Backend, library_version
from constrained.grammars.errors import GrammarError
from constrained.grammars.matcher import fill_only

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

    def __init__(self, spec: GrammarSpec | None, vocab: Vocab, compiled: Any = None) -> None:
        import xgrammar

        self.vocab = vocab
        if spec is None:  # loaded from the store
            self.compiled = compiled
            return
        compiler = xgrammar.GrammarCompiler(vocab.xgrammar(), max_threads=1, cache_enabled=False)
        try:
            if spec.kind == "json_schema":
                if spec.whitespace == "compact":
                    kwargs = {"any_whitespace": False, "separators": (",", ":")}
                else:
                    kwargs = {"any_whitespace": True, "max_whitespace_cnt": spec.max_whitespace}
                self.compiled = compiler.compile_json_schema(
                    spec.source, strict_mode=spec.close_objects, **kwargs
                )
            elif spec.kind == "regex":
                self.compiled = compiler.compile_regex(spec.source)
            else:
                self.compiled = compiler.compile_grammar(spec.source)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError with the reason
            raise GrammarError(NAME, _clean(str(exc))) from None

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)


class XGrammarMatcher:
    def __init__(self, grammar: XGrammarGrammar) -> None:
        import xgrammar

        self.eos = grammar.vocab.eos_token_id
        self.inner = xgrammar.GrammarMatcher(grammar.compiled)  # rollback is unlimited
        self.error: str | None = None

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


def _load(payload: bytes, vocab: Vocab) -> XGrammarGrammar:
    import xgrammar

    compiled = xgrammar.CompiledGrammar.deserialize_json(payload.decode(), vocab.xgrammar())
    return XGrammarGrammar(None, vocab, compiled)


def _clean(message: str) -> str:
    """First line of an xgrammar error, without its "[time] file.cc:line: " prefix."""
    lines = message.strip().splitlines()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0] if lines else "failed")[:500]


BACKEND = Backend(
    NAME,
    XGrammarGrammar,
    version=library_version("xgrammar"),
    dump=lambda grammar: grammar.compiled.serialize_json().encode(),
    load=_load,
    refusal=RULES.refusal,
    store_after_s=STORE_AFTER_S,
)
