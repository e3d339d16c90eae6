"""Every table of the served vocabulary that a process's first constrained rows read, built
in one call, so that a warm-up thread (``admission.warm_when_served``) builds them while the
engine waits for requests instead of in its first steps (#55); and those a frontend's first
admission reads (``build_admission_tables``), built while the engine starts.

Each table is still built once per vocabulary wherever it is first read (``Vocab._once``):
this only reads them early. For Qwen2's 152k tokens on the 2-core machine: the backends'
tokenizers, the store's fingerprint and the encode core (``Vocab.warm``) about 1 s, the
finite-number rule's table 0.05 s, closing's two finishing orders 0.07 s, its UTF-8 seams
0.01 s.

Example::

    build_tables(load_vocab(tokenizer_dir, 151_936))
    build_admission_tables(load_vocab(tokenizer_dir, 151_936))
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from constrained.grammars.closing import token_ranks
from constrained.grammars.finite_matcher import tokens_of
from constrained.grammars.token_shapes import utf8_seams
from constrained.grammars.vocab import Vocab

# A fork waits for the frontend's table under way (vLLM forks its engine core from the
# frontend by default, unless CUDA is initialised): the child never holds a table half built,
# nor a build's lock that a thread it does not have would release. (Each build under it
# reads the tokenizer the frontend holds: nothing is loaded, no I/O but the record's write.)
_BETWEEN_TABLES = threading.RLock()  # (a build that forks itself goes on)
os.register_at_fork(
    before=_BETWEEN_TABLES.acquire,
    after_in_parent=_BETWEEN_TABLES.release,
    after_in_child=_BETWEEN_TABLES.release,
)


@contextmanager
def one_table() -> Iterator[None]:
    """A warm-up's build of one table (or the vocabulary): no fork in the middle of it."""
    with _BETWEEN_TABLES:
        yield


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


def build_admission_tables(vocab: Vocab) -> None:
    """Build the tables a first admission reads (its compile and its budget check's walk),
    one at a time (``one_table``): for Qwen2 on two cores, the token bytes and the record
    (built with the vocabulary) 0.3 s, llguidance's tokenizer 0.25-0.3 s, the finite-number
    table 0.04 s, closing's orders."""
    builds: list[Callable[[], object]] = [
        vocab.fingerprint,  # the store's keys
        vocab.llguidance,  # the budget check walks a matcher
        lambda: tokens_of(vocab),  # the finite-number rule: every JSON schema's compile
        lambda: token_ranks(vocab, closers_first=True),  # the budget check's witness walk
        lambda: token_ranks(vocab, closers_first=False),
    ]
    for build in builds:  # a fork is let in only between two
        with one_table():
            build()
