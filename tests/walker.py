"""Walking an instance through a compiled grammar token by token, as a sampler would.

Shared by the JSON-Schema-Test-Suite test (``test_schema_suite.py``) and the MaskBench
benchmark (``benchmarks/maskbench.py``): an instance is accepted when every token of its compact
serialization, then end-of-sequence, is allowed by the mask filled before it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np


def serialize(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


class ExactTokenizer:
    """Token ids whose bytes are exactly the text's UTF-8 bytes.

    The Qwen2 tokenizer NFC-normalizes (``"a\u0308"`` would be walked as ``"ä"``) and turns
    ``<|endoftext|>`` written in a string into the special token; neither may change the
    instance under test. So the tokenizer runs without its normalizer, and when the ids still
    do not spell the text (special-token text), the text is walked one byte token per byte.
    """

    def __init__(self, vocab: Any) -> None:
        from tokenizers import Tokenizer

        spec = json.loads(vocab.hf_tokenizer.backend_tokenizer.to_str())
        spec["normalizer"] = None
        self.inner = Tokenizer.from_str(json.dumps(spec))
        self.pieces: list[bytes] = vocab.token_bytes()
        self.byte_ids: dict[int, int] = {}
        for token_id, piece in enumerate(self.pieces):
            if len(piece) == 1:
                self.byte_ids.setdefault(piece[0], token_id)

    def encode(self, text: str) -> list[int]:
        raw = text.encode("utf-8")  # a lone surrogate raises: the instance is not UTF-8 text
        ids = self.inner.encode(text, add_special_tokens=False).ids
        if b"".join(self.pieces[i] for i in ids) == raw:
            return ids
        return [self.byte_ids[b] for b in raw]


class Walker:
    """Walks instances through a compiled grammar token by token, timing every mask fill."""

    def __init__(self, vocab: Any) -> None:
        import torch

        from constrained.grammars.matcher import words_for

        self.vocab = vocab
        self.eos: int = vocab.eos_token_id
        self.tokenizer = ExactTokenizer(vocab)
        self.bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
        self.words = self.bitmask.numpy()[0].view(np.uint32)
        self.mask_ns: list[int] = []  # every fill's duration, appended by ``walk``

    def tokens(self, data: Any) -> list[int]:
        return self.tokenizer.encode(serialize(data))

    def walk(self, compiled: Any, tokens: list[int]) -> tuple[bool, bool]:
        """(accepted, disagreement): every token and then EOS allowed by the mask before it;
        disagreement when the matcher refused a token its own mask allowed."""
        matcher = compiled.matcher()
        for token in [*tokens, self.eos]:
            start = time.perf_counter_ns()
            matcher.fill(self.bitmask, 0)
            self.mask_ns.append(time.perf_counter_ns() - start)
            if not (int(self.words[token >> 5]) >> (token & 31)) & 1:
                return False, False
            if token == self.eos:
                return True, False
            if not matcher.consume([token]):
                return False, True
        raise AssertionError("unreachable: the loop ends on EOS")

    def accepts(self, compiled: Any, data: Any) -> bool:
        return self.walk(compiled, self.tokens(data))[0]
