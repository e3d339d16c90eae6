"""outlines-core: JSON schemas (through its regex translation) and regexes; no grammars.

Its contract: outlines-core silently ignores what it does not implement, so a JSON schema may
use only the keywords of ``RULES`` (its allow-list, with the combination rules of
``allow_list``); anything else is refused with the keyword and its JSON pointer before it
compiles. Beyond the shared rules: no ``prefixItems`` (it joins their regexes without
grouping them: ``[{}]`` matches any text that starts with "[true"), no numeric bounds or
``multipleOf``, no ``minProperties`` / ``maxProperties`` / ``patternProperties``, no
``additionalProperties`` given as a schema; of the formats only ``uuid`` and ``email`` (its
date accepts 2020-02-30 and non-ASCII digits, its time and date-time a time without offset,
its uri "https://example.org/foobar\\.txt" and a lone "%"); its ``\\d`` ``\\w`` ``\\b`` are
Unicode classes (ECMA-262: ASCII). Grammars (``kind="grammar"``) are refused.

outlines-core has crashed the whole process on some schemas while building the regex, so the
translation runs in a forked child process; the index itself is built here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from constrained.errors import GrammarError
from constrained.grammars.backend import Backend, library_version
from constrained.grammars.matcher import Matcher, fill_only
from constrained.schema.allow_list import AllowList

if TYPE_CHECKING:
    import torch

    from constrained.grammars.spec import GrammarSpec
    from constrained.grammars.vocab import Vocab

NAME = "outlines"

# The keywords it enforces (in the combinations ``allow_list`` allows).
KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties",
        "items", "anyOf", "allOf", "oneOf", "$ref", "minItems", "maxItems", "minLength",
        "maxLength", "pattern", "format",
    }
)  # fmt: skip

RULES = AllowList(
    keywords=KEYWORDS,
    formats=frozenset({"uuid", "email"}),
    pattern_escapes="dDwWbB",
    schema_additional_properties=False,
    infers_container_type=False,
)
_TRANSLATE_TIMEOUT_S = 60.0


def schema_regex(spec: GrammarSpec) -> str:
    """outlines-core's regex for a JSON schema, computed in a forked child process.

    ``os.fork`` rather than ``multiprocessing``: vLLM's workers are daemonic processes, which
    multiprocessing forbids to have children. The child runs one Rust call and exits.
    """
    from outlines_core.json_schema import build_regex_from_schema

    whitespace = "" if spec.whitespace == "compact" else rf"[ \n\t]{{0,{spec.max_whitespace}}}"
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            reply = {"ok": build_regex_from_schema(spec.source, whitespace)}
        except BaseException as exc:
            reply = {"error": str(exc) or type(exc).__name__}
        with os.fdopen(write_fd, "w") as out:
            json.dump(reply, out)
        os._exit(0)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as inp:
            ready, _, _ = select.select([inp], [], [], _TRANSLATE_TIMEOUT_S)
            if not ready:
                raise GrammarError(NAME, "translating the schema to a regex timed out")
            text = inp.read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not text:
        raise GrammarError(NAME, "outlines-core crashed translating the schema")
    reply = json.loads(text)
    if "error" in reply:
        raise GrammarError(NAME, reply["error"].strip().splitlines()[0][:500])
    return reply["ok"]


class OutlinesGrammar:
    backend = NAME
    history = False  # rows are the grammar state's (backend.CompiledGrammar)

    def __init__(self, spec: GrammarSpec | None, vocab: Vocab, index: Any = None) -> None:
        from outlines_core import Index

        if spec is None:  # loaded from the store
            self.vocab, self.index = vocab, index
            return
        regex = schema_regex(spec) if spec.kind == "json_schema" else spec.source
        self.vocab = vocab
        try:
            self.index = Index(regex, vocab.outlines())
        except Exception as exc:
            raise GrammarError(NAME, str(exc).strip().splitlines()[0][:500]) from None

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)


MAX_ROLLBACK = 512  # states kept (outlines-core's default is 32); a state is one integer


class OutlinesMatcher(Matcher):
    def __init__(self, grammar: OutlinesGrammar) -> None:
        from outlines_core import Guide

        self.eos = grammar.vocab.eos_token_id
        # Rollback reaches back as far as a witness walk goes (grammars/closing.py).
        self.inner = Guide(grammar.index, max_rollback=MAX_ROLLBACK)
        self.index = grammar.index  # the guide's own automaton (``completes`` walks it)
        self.error: str | None = None
        self.finished = False

    def consume(self, tokens: Sequence[int]) -> bool:
        for token in tokens:
            if self.error is not None:
                break
            if int(token) == self.eos and self.inner.is_finished():
                self.finished = True
                continue
            if self.finished:
                self.error = f"token {token} after the end of the grammar"
                break
            try:
                self.inner.advance(int(token), False)
            except Exception:  # outlines raises on a token the index does not allow
                self.error = f"token {token} not allowed by the grammar"
                break
        return self.error is None

    def try_consume(self, tokens: Sequence[int]) -> int:
        count = 0
        for token in tokens:
            if self.error is not None or self.finished or token == self.eos:
                break
            try:
                self.inner.advance(int(token), False)
            except Exception:
                break
            count += 1
        return count

    def completes(self, tokens: Sequence[int]) -> bool:
        """Exactly ``try_consume`` + ``accepts_end`` + ``rollback`` without moving the guide:
        its state walked through the index it advances by (``Guide.advance`` is the index's
        ``get_next_state``, ``is_finished`` its ``is_final_state`` of the state; the index
        has no transition on end-of-sequence, which ``try_consume`` never takes either),
        about 1.8x cheaper (``benchmarks.completes_cost``): no exception on a refused token,
        no state history, no rollback."""
        if self.error is not None or self.finished:
            return not tokens and self.accepts_end()
        step, state = self.index.get_next_state, self.inner.get_state()
        eos = self.eos
        try:
            for token in tokens:
                if token == eos:
                    return False
                state = step(state, token)
                if state is None:
                    return False
        except (OverflowError, TypeError):  # not a token id
            return False
        return self.index.is_final_state(state)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.error is not None or self.finished:
            fill_only(bitmask, row, [self.eos])
            return
        target = bitmask[row]
        self.inner.write_mask_into(target.data_ptr(), target.numel(), target.element_size())

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback_state(num_tokens)
            self.finished = False

    def accepts_end(self) -> bool:
        return self.error is None and (self.finished or self.inner.is_finished())


def _dump(grammar: OutlinesGrammar) -> bytes:
    _, (payload,) = grammar.index.__reduce__()  # (Index.from_binary, (bytes,))
    return payload


def _load(payload: bytes, vocab: Vocab) -> OutlinesGrammar:
    from outlines_core import Index

    return OutlinesGrammar(None, vocab, Index.from_binary(payload))


BACKEND = Backend(
    NAME,
    OutlinesGrammar,
    version=library_version("outlines_core"),
    dump=_dump,
    load=_load,
    refusal=RULES.refusal,
    kinds=frozenset({"json_schema", "regex"}),
)
