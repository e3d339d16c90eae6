"""The new samplers on the real vLLM engine (CPU build, tiny model): what each does to what is
sampled, how they compose with a JSON schema, and refusals. Exact row-level math is checked
against references in ``test_truncation_samplers.py`` and ``tests/v2_real/``."""

from __future__ import annotations

import itertools
import json

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

A, B, C = 11, 12, 13  # ",", "-", "." in the Qwen vocabulary
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "SELECT * FROM"]


def generate(llm, extra: dict | None, **params) -> list[list[int]]:
    params.setdefault("max_tokens", 16)
    params.setdefault("ignore_eos", True)
    outs = llm.generate(PROMPTS, SamplingParams(extra_args=extra, **params), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_xtc_removes_the_top_choices(llm):
    """A, B and C all above the threshold (p ~ 0.87, 0.12, 0.016 before the model's own
    logits shift them): XTC leaves C, the least likely of them, on top."""
    bias = {A: 30.0, B: 28.0, C: 26.0}
    base = {"logit_bias": bias}
    without = generate(llm, base, temperature=0.05, seed=1)
    assert all(set(ids) == {A} for ids in without)
    xtc = {**base, "xtc_probability": 1.0, "xtc_threshold": 0.001}
    assert all(set(ids) == {C} for ids in generate(llm, xtc, temperature=0.05, seed=1))
    never = {**base, "xtc_probability": 0.0}
    assert generate(llm, never, temperature=0.05, seed=1) == without


def test_xtc_draws_are_reproducible_with_a_seed(llm):
    """Half the steps remove A and B: which ones depends only on the seed and position."""
    extra = {"logit_bias": {A: 30.0, B: 28.0, C: 26.0}, "xtc_probability": 0.5,
             "xtc_threshold": 0.001}  # fmt: skip
    first = generate(llm, extra, temperature=0.05, seed=3, max_tokens=32)
    assert all(set(ids) == {A, C} for ids in first), first  # both outcomes occur
    alone = llm.generate(
        PROMPTS[1],
        SamplingParams(extra_args=extra, temperature=0.05, seed=3, max_tokens=32, ignore_eos=True),
        use_tqdm=False,
    )
    assert list(alone[0].outputs[0].token_ids) == first[1]  # same draws outside the batch


def test_top_n_sigma_keeps_only_tokens_near_the_top(llm):
    extra = {"logit_bias": {A: 10.0}}
    without = generate(llm, extra, temperature=1.0, seed=2)
    assert any(set(ids) != {A} for ids in without)
    with_sigma = generate(llm, {**extra, "top_n_sigma": 1.0}, temperature=1.0, seed=2)
    assert all(set(ids) == {A} for ids in with_sigma)


def test_typical_p_keeps_the_typical_tokens(llm):
    """Two tokens carry most of the mass and sit nearest the entropy: typical_p = 0.5 keeps
    only them; without it the long tail is sampled too."""
    extra = {"logit_bias": {A: 12.0, B: 12.0}}
    without = generate(llm, extra, temperature=1.0, seed=4, max_tokens=32)
    assert any(set(ids) - {A, B} for ids in without)
    typical = generate(llm, {**extra, "typical_p": 0.5}, temperature=1.0, seed=4, max_tokens=32)
    assert all(set(ids) <= {A, B} for ids in typical)


def test_greedy_requests_ignore_the_truncation_samplers(llm):
    extra = {"top_n_sigma": 0.5, "typical_p": 0.2, "xtc_probability": 1.0, "xtc_threshold": 0.0}
    assert generate(llm, extra, temperature=0.0) == generate(llm, None, temperature=0.0)


def test_samplers_compose_with_a_json_schema(llm):
    """Truncation after the grammar mask: every finished output still validates."""
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    extra = {
        "json_schema": json.dumps(schema),
        "top_n_sigma": 2.0,
        "typical_p": 0.9,
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
    }
    outs = llm.generate(
        PROMPTS * 2,
        SamplingParams(temperature=1.0, seed=5, max_tokens=120, extra_args=extra),
        use_tqdm=False,
    )
    finished = [o.outputs[0] for o in outs if o.outputs[0].finish_reason == "stop"]
    assert len(finished) >= 4
    for out in finished:
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"top_n_sigma": -1}, "top_n_sigma"),
        ({"typical_p": 0}, "typical_p"),
        ({"xtc_probability": 0.5, "xtc_threshold": 0.9}, "xtc_threshold"),
        ({"xtc_threshold": 0.2}, "xtc_threshold"),
    ],
)
def test_bad_sampler_values_are_refused_and_the_engine_keeps_serving(llm, extra, field):
    with pytest.raises((ValueError, VLLMValidationError), match=f"'{field}'"):
        llm.generate("hi", SamplingParams(max_tokens=2, extra_args=extra), use_tqdm=False)
    assert generate(llm, None, temperature=0.0, max_tokens=2)


def test_no_repeat_ngram_leaves_no_repeated_bigram(llm):
    """The tiny model's greedy output repeats itself; with no_repeat_ngram_size=2 no bigram
    occurs twice."""

    def bigrams(ids: list[int]) -> list[tuple[int, int]]:
        return list(itertools.pairwise(ids))

    plain = generate(llm, None, temperature=0.0, max_tokens=48)
    assert any(len(set(bigrams(ids))) < len(bigrams(ids)) for ids in plain)
    banned = generate(llm, {"no_repeat_ngram_size": 2}, temperature=0.0, max_tokens=48)
    for ids in banned:
        assert len(set(bigrams(ids))) == len(bigrams(ids)), ids
    ocr_names = generate(llm, {"ngram_size": 2, "window_size": 100}, temperature=0.0, max_tokens=48)
    assert ocr_names == banned  # vLLM's DeepSeek-OCR option names, same result


def test_dry_breaks_the_greedy_loop(llm):
    """The tiny model's greedy output repeats; DRY penalizes the token that would extend a
    repeat, so the output changes and its longest repeated run gets shorter."""

    def longest_repeat(ids: list[int]) -> int:
        best = 0
        for i in range(len(ids)):
            for j in range(i + 1, len(ids)):
                n = 0
                while j + n < len(ids) and ids[i + n] == ids[j + n]:
                    n += 1
                best = max(best, n)
        return best

    plain = generate(llm, None, temperature=0.0, max_tokens=40)
    extra = {"dry_multiplier": 5.0, "dry_base": 2.0, "dry_allowed_length": 2,
             "dry_sequence_breakers": []}  # fmt: skip
    dry = generate(llm, extra, temperature=0.0, max_tokens=40)
    assert dry != plain
    assert max(map(longest_repeat, dry)) < max(map(longest_repeat, plain))
    # A greedy token never extends a repeat longer than allowed when the penalty is huge.
    huge = generate(llm, {**extra, "dry_multiplier": 100.0}, temperature=0.0, max_tokens=40)
    assert max(map(longest_repeat, huge)) <= 3


# A list of objects: its keys and punctuation must repeat, whatever the bans say.
LIST_OF_OBJECTS = {
    "type": "array",
    "minItems": 3,
    "maxItems": 6,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "kind": {"enum": ["a", "b"]}},
        "required": ["name", "kind"],
        "additionalProperties": False,
    },
}
STRUCTURE = ['{"', '"', '":', '","', '"},{"', ",", "{", "}", "]", "[", '"}', '"},']


@pytest.mark.parametrize(
    "extra",
    [
        {"no_repeat_ngram_size": 2},
        {"no_repeat_ngram_size": 3},
        # penalties past float32's range (a finite push: held at the limit, not -inf)
        {"dry_multiplier": 1e38, "dry_allowed_length": 1, "dry_sequence_breakers": []},
        {"repetition_penalty": 1e30},  # (the largest accepted)
        {"logit_bias": "structure"},
    ],
    ids=["ngram2", "ngram3", "dry_huge", "repetition_huge", "bias_against_structure"],
)
def test_no_ban_or_penalty_empties_a_grammar_row(llm, extra):
    """The grammar wins: it masks first, the bans never remove the last token it allows,
    and penalties are finite pushes (a masked logit stays -inf, an allowed one finite), so
    the row keeps a token to sample even when every allowed token is banned or penalized
    (a row with no finite logit would sample token 0, "!", which the grammar refuses).
    Penalized everywhere (``penalize_structure``), every output stops complete and valid, at
    temperatures 1, 0.5 and greedy; the lists repeat their structure bigrams."""
    import jsonschema

    if extra.get("logit_bias") == "structure":
        tokenizer = llm.get_tokenizer()
        extra = {"logit_bias": {tokenizer.encode(s)[0]: -100 for s in STRUCTURE}}
    else:  # penalized and banned everywhere: the structure too (the scope spares it)
        extra = {**extra, "penalize_structure": True}
    params = [
        SamplingParams(
            temperature=temperature,
            seed=i,
            max_tokens=160,
            extra_args={"json_schema": LIST_OF_OBJECTS, **extra},
        )
        for i, temperature in enumerate([1.0, 0.5, 0.0, 1.0])
    ]
    outs = llm.generate(["List some items as JSON."] * 4, params, use_tqdm=False)
    repeated_bigrams = 0
    for out in outs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (extra, completion.text)
        jsonschema.validate(json.loads(completion.text), LIST_OF_OBJECTS)
        ids = list(completion.token_ids)
        bigrams = list(itertools.pairwise(ids))
        repeated_bigrams += len(bigrams) - len(set(bigrams))
    assert repeated_bigrams > 0  # the grammar's repeats were kept, bans notwithstanding
