"""xgrammar: fast JSON-schema, regex and GBNF masks.

xgrammar silently ignores some JSON-schema keywords; ``schema_support`` refuses schemas that
use them before they get here. It is the backend with a per-separator whitespace cap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from constrained.grammars.errors import GrammarError
from constrained.grammars.matcher import fill_only
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.vocab import Vocab

NAME = "xgrammar"


class XGrammarGrammar:
    backend = NAME

    def __init__(self, spec: GrammarSpec, vocab: Vocab) -> None:
        import xgrammar

        self.vocab = vocab
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


def _clean(message: str) -> str:
    """First line of an xgrammar error, without its "[time] file.cc:line: " prefix."""
    lines = message.strip().splitlines()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0] if lines else "failed")[:500]
