"""Where a processor runs in a parallel engine (``placement.py``), and what it does there.

The engine-level checks (tensor, pipeline and data parallel layouts against one worker) are
in ``test_parallel.py``; these drive the processors directly.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from constrained.processors import runners
from constrained.processors.grammar_mask import GrammarMaskProcessor
from constrained.processors.penalties import PenaltiesProcessor
from constrained.processors.placement import Placement, placement_of
from tests.simulate import fake_vllm_config

VOCAB = 64


def lone_config(**parallel) -> SimpleNamespace:
    pc = dict(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
              data_parallel_index=0, distributed_executor_backend="mp")  # fmt: skip
    pc.update(parallel)
    return SimpleNamespace(parallel_config=SimpleNamespace(**pc))


def test_a_lone_worker_samples_and_has_no_tag() -> None:
    assert placement_of(SimpleNamespace()) == Placement()  # no parallel config at all
    alone = placement_of(lone_config())
    assert alone.samples and not alone.parallel and alone.tag == ""


def test_a_data_parallel_engine_is_tagged() -> None:
    second = placement_of(lone_config(data_parallel_index=1))
    assert second.samples and second.tag == "dp1-pp0-tp0"
    assert placement_of(lone_config(data_parallel_size=2)).tag == "dp0-pp0-tp0"


def added(params: SamplingParams) -> BatchUpdate:
    return BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1, 2, 3], [])], moved=[])


@pytest.mark.parametrize("samples", [True, False])
def test_a_stage_that_never_samples_ignores_requests(samples: bool, monkeypatch) -> None:
    placement = Placement(pp_rank=0 if not samples else 1, parallel=True, samples=samples)
    monkeypatch.setattr(runners, "placement_of", lambda config: placement)
    proc = PenaltiesProcessor(fake_vllm_config(4, VOCAB), "cpu", False)
    proc.update_state(added(SamplingParams(extra_args={"presence_penalty": 1.0})))
    assert int(proc.slots.active.sum()) == (1 if samples else 0)


def test_the_grammar_mask_loads_nothing_on_a_stage_that_never_samples(monkeypatch) -> None:
    # The fake config has no tokenizer: building the grammar processor would fail if it
    # loaded the vocabulary.
    stage = Placement(pp_rank=0, parallel=True, samples=False)
    monkeypatch.setattr(runners, "placement_of", lambda config: stage)
    proc = GrammarMaskProcessor(fake_vllm_config(4, VOCAB), "cpu", False)
    assert not hasattr(proc, "compiler")
    proc.update_state(added(SamplingParams(extra_args={"regex": "[a-z]+"})))
    proc.update_state(None)
    assert int(proc.slots.active.sum()) == 0
    assert all(p is None for p in proc.slots.payload)


def test_each_worker_writes_its_own_stats_file(tmp_path, monkeypatch) -> None:
    from constrained import settings
    from constrained.processors.stats import StatsReporter

    monkeypatch.setenv("CONSTRAINED_STATS_PATH", str(tmp_path / "engine_stats.json"))
    monkeypatch.setenv("CONSTRAINED_STATS_INTERVAL_S", "0")
    settings.reset()
    try:
        proc = PenaltiesProcessor(fake_vllm_config(4, VOCAB), "cpu", False)
        reporter = StatsReporter()
        reporter.register(proc, "dp0-pp1-tp0")
        reporter.tick()
    finally:
        settings.reset()
    snap = json.loads((tmp_path / "engine_stats.dp0-pp1-tp0.json").read_text())
    assert snap["worker"] == "dp0-pp1-tp0"


def test_unseeded_xtc_draws_agree_across_tensor_parallel_ranks() -> None:
    """Each tensor-parallel rank has its own XTC processor; an unseeded request's seed comes
    from a per-processor counter. Fed the same batch updates (as every rank is), two
    processors must give every row the same seed and mask the same logits."""
    import random

    import torch

    from constrained.processors.xtc import XtcProcessor
    from tests.simulate import Request, V1Batch

    ranks = [XtcProcessor(fake_vllm_config(8, VOCAB), "cpu", False) for _ in range(2)]
    batch, rng = V1Batch(8, random.Random(3)), random.Random(4)
    torch.manual_seed(0)
    masked_rows = 0
    for step in range(60):
        new = [
            Request(step * 10 + k, SamplingParams(temperature=1.0, extra_args={
                "xtc_probability": 0.7, "xtc_threshold": 0.01}), [1, 2, step])
            for k in range(rng.randint(0, 2))
        ]  # fmt: skip
        update = batch.step(new)
        logits = torch.randn(len(batch.rows), VOCAB)
        outs = []
        for proc in ranks:
            proc.update_state(update)
            outs.append(proc.apply(logits.clone()))
        assert torch.equal(ranks[0].slots.host["seed"], ranks[1].slots.host["seed"])
        assert torch.equal(outs[0], outs[1])
        masked_rows += int((outs[0] == float("-inf")).any(dim=1).sum())
        for req in batch.rows:
            req.output.append(rng.randrange(VOCAB))
    assert masked_rows > 20, "XTC should have removed top tokens in many rows"
