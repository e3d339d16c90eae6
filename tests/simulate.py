"""Drive processors the way vLLM's Model Runner V1 does, without an engine.

``V1Batch`` keeps a persistent batch like vLLM's ``InputBatch`` (condensed indices, holes
filled by adds or by moving the last request down, swaps for reordering, preempted requests
re-added with their output so far) and emits the matching ``BatchUpdate``s, as vLLM's own
``tests/v1/logits_processors/test_correctness.py`` does. Model Runner V2 is tested on vLLM's
real V2 sampler code instead (``tests/v2_real/``); ``FakeReqStates`` only builds a V2
processor without a runner.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality


def fake_vllm_config(
    max_num_seqs: int, vocab_size: int, model: str | None = None, **fields: object
) -> SimpleNamespace:
    """The fields our V1 constructors read from ``VllmConfig``: the batch's size, the
    vocabulary's width, no speculative decoding and, for the grammar processor, the model
    whose tokenizer it loads (``model``); ``fields`` adds others
    (``structured_outputs_config``)."""
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab_size)
    if model is not None:
        model_config.tokenizer = model_config.model = str(model)
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=model_config,
        speculative_config=None,
        **fields,
    )


def _uva(values: np.ndarray) -> SimpleNamespace:
    """A host array with a device view, like vLLM's ``UvaBackedTensor`` (.np / .gpu)."""
    return SimpleNamespace(np=values, gpu=torch.from_numpy(values))


class FakeReqStates(SimpleNamespace):
    """V2's ``LogitsProcRequestState``: token history per slot, as the model runner keeps it."""

    def __init__(self, max_num_reqs: int, vocab_size: int, max_model_len: int = 512) -> None:
        super().__init__(
            device=torch.device("cpu"),
            max_num_reqs=max_num_reqs,
            vocab_size=vocab_size,
            all_token_ids=SimpleNamespace(
                gpu=torch.zeros(max_num_reqs, max_model_len, dtype=torch.int32)
            ),
            prompt_len=_uva(np.zeros(max_num_reqs, dtype=np.int32)),
            prefill_len=_uva(np.zeros(max_num_reqs, dtype=np.int32)),
            total_len=SimpleNamespace(gpu=torch.zeros(max_num_reqs, dtype=torch.int32)),
        )


def fake_req_states(max_num_reqs: int, vocab_size: int) -> FakeReqStates:
    return FakeReqStates(max_num_reqs, vocab_size)


@dataclass
class Request:
    req_id: int
    params: SamplingParams
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    done: bool = False  # finished (end-of-sequence or max_tokens): leaves at the next step


class V1Batch:
    """A persistent batch that emits V1 ``BatchUpdate``s for random joins, leaves and moves."""

    def __init__(self, capacity: int, rng: random.Random) -> None:
        self.capacity = capacity
        self.rng = rng
        self.rows: list[Request] = []
        self.preempted: list[Request] = []

    def step(self, new_requests: list[Request]) -> BatchUpdate | None:
        rng = self.rng
        removed: list[int] = []
        for i, req in enumerate(self.rows):
            if req.done or rng.random() < 0.15:
                removed.append(i)
        holes = sorted(removed)
        for i in removed:
            if not self.rows[i].done and rng.random() < 0.3:  # preempted: back with its output
                self.preempted.append(self.rows[i])
        slots: list[Request | None] = list(self.rows)
        for i in removed:
            slots[i] = None
        added = []
        incoming = list(new_requests)
        if self.preempted and rng.random() < 0.5:
            incoming.append(self.preempted.pop())
        for req in incoming:
            if holes:
                index = holes.pop(0)
            elif len(slots) < self.capacity:
                index = len(slots)
                slots.append(None)
            else:
                break
            slots[index] = req
            added.append((index, req.params, req.prompt, req.output))
        filled = {a[0] for a in added}
        removed = [i for i in removed if i not in filled]
        moved = []
        # Condense: move the last request into each remaining hole.
        while None in slots:
            hole = slots.index(None)
            while slots and slots[-1] is None:
                slots.pop()
            if hole >= len(slots):
                break
            last = len(slots) - 1
            slots[hole] = slots.pop()
            moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        for _ in range(rng.randint(0, 2)):
            if len(slots) >= 2:
                a, b = rng.sample(range(len(slots)), 2)
                slots[a], slots[b] = slots[b], slots[a]
                moved.append((a, b, MoveDirectionality.SWAP))
        self.rows = [r for r in slots if r is not None]
        assert len(self.rows) == len(slots)
        if not (removed or added or moved):
            return None
        return BatchUpdate(batch_size=len(self.rows), removed=removed, added=added, moved=moved)
