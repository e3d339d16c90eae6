"""Grammar compilation and backends: JSON schema, regex and grammar constraints as token masks.

The JSON-Schema algebra (walking, negation, rewriting, allow-lists, array-check planning, the
JSON scanner, schema input) is the sibling package ``constrained.schema``; ``GrammarError``
is ``constrained.errors``.

``GrammarSpec`` says what to match; ``compile_now`` / ``GrammarCompiler`` turn it into a
compiled grammar of one backend (llguidance, xgrammar, outlines-core), whose ``matcher()``
follows one request and fills its next-token bitmask.

Modules:

- ``spec``: ``GrammarSpec``, the constraint (and compile-cache key).
- ``vocab``: ``Vocab``, the tokenizer in each backend's form; ``vocab_record``: its record in
  the store, for a process that does not have the tokenizer; ``vocab_tables``: every table
  of it a process's first rows read, built in one call (the engine's warm-up).
- ``matcher``: the ``Matcher`` interface and bitmask helpers.
- ``backend``: ``Backend``, what a backend plugs in.
- ``checked_matcher``: a backend's matcher plus the array checks (``uniqueItems`` / ``contains``);
  its parts ``checked_text`` (the JSON text followed), ``checked_row`` (a row's clearing),
  ``checked_lookahead`` (one token's verdict), ``checked_contains`` (items that must match).
- ``closing``: witness walks, finishing inside a token budget.
- ``closing_matcher``: ``ClosingMatcher``, the row's layer that finishes by ``max_tokens``;
  ``token_shapes`` (its vocabulary tables: token classes, free text, half-written tokens)
  and ``closing_sorts`` (its kept near-row sorts, shared by a grammar's requests).
- ``reasoning_gate``: ``GatedMatcher``, the top layer of a request that thinks first.
- ``stack``: ``build_stack``, a request's row as a stack of matchers.
- ``llguidance_backend``, ``xgrammar_backend``, ``outlines_backend``: one backend each.
- ``registry``: the backends in ``auto`` order, ``BACKEND_NAMES``, ``get_backend``.
- ``auto``: which backend compiles a spec.
- ``regex_size``, ``size_guard``: refusing regexes too big to unroll.
- ``cache``: the bounded LRU of compile futures.
- ``compiler``: ``compile_now``; ``GrammarCompiler`` (cache, store, threads, time limit),
  ``compiler_for``.
- ``store``: ``GrammarStore``, compiled grammars (and the tokenizer's record) on disk:
  admission saves, the engine loads.
"""

from constrained.errors import GrammarError
from constrained.grammars.compiler import GrammarCompiler, compile_now, compiler_for
from constrained.grammars.spec import GrammarSpec
from constrained.grammars.vocab import Vocab, load_vocab

__all__ = [
    "GrammarCompiler",
    "GrammarError",
    "GrammarSpec",
    "Vocab",
    "compile_now",
    "compiler_for",
    "load_vocab",
]
