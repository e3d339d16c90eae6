"""Grammar compilation and backends: JSON schema, regex and grammar constraints as token masks.

``GrammarSpec`` says what to match; ``compile_now`` / ``GrammarCompiler`` turn it into a
compiled grammar of one backend (llguidance, xgrammar, outlines-core), whose ``matcher()``
follows one request and fills its next-token bitmask.
"""

from constrained.grammars.compiler import GrammarCompiler, compile_now, compiler_for
from constrained.grammars.errors import GrammarError
from constrained.grammars.spec import BACKENDS, GrammarSpec
from constrained.grammars.vocab import Vocab, load_vocab

__all__ = [
    "BACKENDS",
    "GrammarCompiler",
    "GrammarError",
    "GrammarSpec",
    "Vocab",
    "compile_now",
    "compiler_for",
    "load_vocab",
]
