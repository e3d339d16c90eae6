"""Installed and unused (#29): the nine entry-point processors, built as vLLM builds them for
``LLM(model)``, cost a request that uses none of our options no tensor work.

Driven with V1 batch updates (adds, moves, swaps, removals of plain requests) under a
``TorchDispatchMode`` that records every tensor operation: while no slot is active, neither
``update_state`` nor ``apply`` runs one, and ``apply`` hands back the logits it was given.
A request with options of ours in between shows that the recorder sees their work, and that
every table is back to its fill values once it leaves. No timing.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

from constrained.plugin import ENTRY_POINT_CLASSES


class TensorOps(TorchDispatchMode):
    """Every aten operation run inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def processors(tiny_model_dir):
    from vllm.engine.arg_utils import EngineArgs

    from constrained.demo import engine_kwargs

    config = EngineArgs(model=tiny_model_dir, **engine_kwargs()).create_engine_config()
    assert not config.model_config.logits_processors  # no flag: the entry points apply
    built = [cls(config, torch.device("cpu"), False) for cls in ENTRY_POINT_CLASSES]
    assert not any(proc.inert for proc in built)
    return built


def plain(seed: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, extra_args=extra or None)


def step(processors, update, logits) -> None:
    for proc in processors:
        proc.update_state(update)
    for proc in processors:
        assert proc.apply(logits) is logits


def assert_all_rows_empty(processors) -> None:
    for proc in processors:
        slots = proc.slots
        assert slots.num_active == 0 and not slots.active.any()
        assert all(payload is None for payload in slots.payload)
        for name, col in slots.columns.items():
            assert bool((slots.host[name] == col.fill).all()), (type(proc).__name__, name)


def test_plain_requests_cost_no_tensor_work(processors) -> None:
    logits = torch.randn(8, processors[0].logits_width)
    before = logits.clone()
    foreign = {"kv_transfer_params": None, "other_plugin_scale": 2.0}  # keys not ours
    swap, move = MoveDirectionality.SWAP, MoveDirectionality.UNIDIRECTIONAL
    added = [(i, plain(i, **(foreign if i % 2 else {})), [1, 2], []) for i in range(8)]
    updates = [
        BatchUpdate(8, [], added, []),
        None,
        BatchUpdate(8, [], [], [(0, 7, swap)]),
        BatchUpdate(7, [3], [], [(7, 3, move)]),
        BatchUpdate(8, [], [(7, plain(9), [1], [5, 6])], []),  # preempted, back with output
        BatchUpdate(0, list(range(8)), [], []),
    ]
    with TensorOps() as recorder:
        for update in updates:
            step(processors, update, logits)
    assert recorder.ops == []
    assert torch.equal(logits, before)
    assert_all_rows_empty(processors)


def test_a_request_of_ours_in_between_leaves_nothing_behind(processors) -> None:
    width = processors[0].logits_width
    ours = plain(1, min_p=0.2, logit_bias={3: 1.0}, repetition_penalty=1.2)
    with TensorOps() as recorder:
        step_with_ours = BatchUpdate(2, [], [(0, plain(0), [1], []), (1, ours, [1], [])], [])
        for proc in processors:
            proc.update_state(step_with_ours)
        logits = torch.randn(2, width)
        for proc in processors:
            logits = proc.apply(logits)
    assert recorder.ops  # the recorder sees our work when there is some
    assert sum(proc.slots.num_active for proc in processors) == 3  # bias, penalties, min-p
    for proc in processors:
        proc.update_state(BatchUpdate(1, [1], [], []))
    assert_all_rows_empty(processors)
    logits = torch.randn(2, width)
    with TensorOps() as recorder:
        step(processors, BatchUpdate(2, [], [(1, plain(2), [1], [])], []), logits)
    assert recorder.ops == []
