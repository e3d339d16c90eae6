"""Every table of the served vocabulary that a process's first constrained rows read, built
in one call, so that a warm-up thread (``admission.warm_when_served``) builds them while the
engine waits for requests instead of in its first steps (#55).

Each table is still built once per vocabulary wherever it is first read (``Vocab._once``):
this only reads them early. For Qwen2's 152k tokens on the 2-core machine: the backends'
tokenizers, the store's fingerprint and the encode core (``Vocab.warm``) about 1 s, the
finite-number rule's table 0.05 s, closing's two finishing orders 0.07 s, its UTF-8 seams
0.01 s.

Example::

    build_tables(load_vocab(tokenizer_dir, 151_936))
"""

from __future__ import annotations

from constrained.grammars.closing import token_ranks
from constrained.grammars.finite_matcher import tokens_of
from constrained.grammars.token_shapes import utf8_seams
from constrained.grammars.vocab import Vocab


def build_tables(vocab: Vocab) -> None:
    """Build the tables a first JSON-schema, regex or grammar row reads, those every row
    reads first (a first row may be waiting for the one under way)."""
    vocab.fingerprint()  # the store's keys
    vocab.llguidance()  # every llguidance row's matcher
    tokens_of(vocab)  # the finite-number rule: every JSON row
    token_ranks(vocab, closers_first=True)  # closing's two finishing orders
    token_ranks(vocab, closers_first=False)
    utf8_seams(vocab)  # closing: characters a token leaves half written
    vocab.warm()  # the rest: the core closing's respelling encodes with, xgrammar's tokenizer
