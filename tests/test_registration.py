"""Options whose processor is not registered are refused, never silently dropped.

Runs vLLM's own admission path (``InputProcessor._validate_params``, which calls each registered
class's ``validate_params``) for subsets of ``constrained.LOGITS_PROCESSORS``: each processor
alone, every processor but one, all of them, and 24 random subsets (seeded), so each
processor's absence is checked beside every other's presence. No engine is started, but the
frontend code is vLLM's.
"""

from __future__ import annotations

import random

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

import constrained
from constrained.frontend import AdmissionUnavailable, input_processor_at_admission
from constrained.processors import GrammarMaskProcessor

# One request per processor, using only that processor's options.
REQUESTS = {
    "constrained.processors.logit_bias:LogitBiasProcessor": {"logit_bias": {"11": 3.0}},
    "constrained.processors.penalties:PenaltiesProcessor": {
        "frequency_penalty": 0.5,
        "penalty_last_n": 8,
    },
    "constrained.processors.dry:DryProcessor": {"dry_multiplier": 0.8, "dry_base": 1.75},
    "constrained.processors.grammar_mask:GrammarMaskProcessor": {"regex": "[0-9]{3}"},
    "constrained.processors.min_p:MinPProcessor": {"min_p": 0.1},
    "constrained.processors.no_repeat_ngram:NoRepeatNGramProcessor": {"no_repeat_ngram_size": 3},
    "constrained.processors.top_n_sigma:TopNSigmaProcessor": {"top_n_sigma": 1.0},
    "constrained.processors.typical_p:TypicalPProcessor": {"typical_p": 0.9},
    "constrained.processors.xtc:XtcProcessor": {"xtc_probability": 0.5, "xtc_threshold": 0.2},
}


def _subsets(names: list[str], random_count: int = 24) -> list[list[str]]:
    alone = [[name] for name in names]
    all_but_one = [[n for n in names if n != left_out] for left_out in names]
    rng = random.Random(0)
    drawn = [sorted(rng.sample(names, rng.randint(2, len(names) - 2))) for _ in range(random_count)]
    unique = {tuple(s): list(s) for s in [*alone, *all_but_one, list(names), *drawn]}
    return list(unique.values())


SUBSETS = _subsets(constrained.LOGITS_PROCESSORS)


@pytest.fixture(scope="module")
def frontend(tiny_model_dir):
    """vLLM's real config and InputProcessor for the tiny model (no engine)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.input_processor import InputProcessor

    from constrained.demo import engine_kwargs

    config = EngineArgs(
        model=tiny_model_dir, logits_processors=list(constrained.LOGITS_PROCESSORS),
        **engine_kwargs(),
    ).create_engine_config()  # fmt: skip
    renderer = InputProcessor(config).renderer

    def admit_with(registered: list[str], extra_args: dict) -> None:
        config.model_config.logits_processors = registered
        processor = InputProcessor(config, renderer)
        processor._validate_params(SamplingParams(extra_args=extra_args), ("generate",))

    return admit_with


def test_rows_cover_every_processor():
    assert set(REQUESTS) == set(constrained.LOGITS_PROCESSORS)
    for name in constrained.LOGITS_PROCESSORS:
        assert [name] in SUBSETS
        assert [n for n in constrained.LOGITS_PROCESSORS if n != name] in SUBSETS


@pytest.mark.parametrize("registered", SUBSETS, ids=lambda s: "+".join(p.split(":")[1] for p in s))
def test_every_subset_refuses_what_it_would_drop(frontend, registered):
    for owner, extra_args in REQUESTS.items():
        if owner in registered:
            frontend(registered, extra_args)  # accepted
            continue
        with pytest.raises(VLLMValidationError) as info:
            frontend(registered, extra_args)
        message = str(info.value)
        assert f"invalid option '{next(iter(extra_args))}'" in message, message
        assert owner in message and "not registered" in message
    # A request mixing every family passes only when every processor is there.
    everything = {k: v for extra in REQUESTS.values() for k, v in extra.items()}
    if len(registered) == len(REQUESTS):
        frontend(registered, everything)
    else:
        with pytest.raises(VLLMValidationError, match="is not applied by this engine"):
            frontend(registered, everything)


def test_validate_params_outside_vllm_admission_fails_loudly():
    """If vLLM stops calling validate_params from its InputProcessor, say so: no silent skip."""
    with pytest.raises(AdmissionUnavailable, match="InputProcessor"):
        GrammarMaskProcessor.validate_params(SamplingParams(extra_args={"regex": "a"}))
    with pytest.raises(AdmissionUnavailable):
        input_processor_at_admission()
