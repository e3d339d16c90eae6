"""End-to-end on the real vLLM engine (CPU build, embedded tiny model, random weights)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from constrained import OptionError, Options

PROMPTS = [
    "The capital of France is",
    '{"name": "Ada", "age":',
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "SELECT * FROM",
]


def token_ids(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_requests_without_options_match_an_engine_without_processors(llm, tiny_model_dir):
    """Registering our processors changes nothing for requests that do not use them."""
    requests = [
        {"prompt": p, "params": {"temperature": t, "seed": 7, "max_tokens": 12, "logprobs": 5}}
        for p in PROMPTS[:4]
        for t in (0.0, 1.0)
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.plain_engine_run", tiny_model_dir, json.dumps(requests)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"baseline engine failed:\n{proc.stderr[-3000:]}"
    baseline = json.loads(lines[-1].removeprefix("RESULT "))

    ours = llm.generate(
        [r["prompt"] for r in requests],
        [SamplingParams(**r["params"]) for r in requests],
        use_tqdm=False,
    )
    for expected, out in zip(baseline, ours, strict=True):
        assert list(out.outputs[0].token_ids) == expected["token_ids"]
        got = [{str(k): v.logprob for k, v in step.items()} for step in out.outputs[0].logprobs]
        assert got == expected["logprobs"]  # bit-identical floats through JSON


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_forces_a_chosen_token(llm, temperature):
    forced = 11  # ","
    params = SamplingParams(
        temperature=temperature,
        seed=1,
        max_tokens=10,
        extra_args={"logit_bias": {forced: 100.0}},
        ignore_eos=True,
    )
    for ids in token_ids(llm.generate(PROMPTS, params, use_tqdm=False)):
        assert ids == [forced] * 10


def test_negative_bias_bans_the_greedy_token(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    first = [ids[0] for ids in token_ids(llm.generate(PROMPTS, greedy, use_tqdm=False))]
    banned = [
        SamplingParams(temperature=0.0, max_tokens=1, extra_args={"logit_bias": {t: -100.0}})
        for t in first
    ]
    again = [ids[0] for ids in token_ids(llm.generate(PROMPTS, banned, use_tqdm=False))]
    assert all(a != b for a, b in zip(first, again, strict=True))


def builtin_and_ours(temperature: float, seed: int, bias: dict[int, float], min_p: float):
    builtin = SamplingParams(
        temperature=temperature, seed=seed, max_tokens=24, logit_bias=bias, min_p=min_p
    )
    ours = SamplingParams(
        temperature=temperature,
        seed=seed,
        max_tokens=24,
        extra_args=Options(logit_bias=bias, min_p=min_p).to_extra_args(),
    )
    return builtin, ours


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_bias_and_min_p_equal_vllm_builtins(llm, temperature):
    rng = random.Random(int(temperature * 10))
    builtin_params, our_params = [], []
    for i, _ in enumerate(PROMPTS):
        bias = {rng.randrange(151_000): rng.choice([-5.0, 3.0, 8.0]) for _ in range(20)}
        min_p = rng.choice([0.01, 0.05, 0.2])
        b, o = builtin_and_ours(temperature, seed=100 + i, bias=bias, min_p=min_p)
        builtin_params.append(b)
        our_params.append(o)
    expected = token_ids(llm.generate(PROMPTS, builtin_params, use_tqdm=False))
    got = token_ids(llm.generate(PROMPTS, our_params, use_tqdm=False))
    assert got == expected
    # And interleaved in one batch: each request still gets the built-in's tokens.
    mixed = llm.generate(PROMPTS + PROMPTS, our_params + builtin_params, use_tqdm=False)
    assert token_ids(mixed)[: len(PROMPTS)] == token_ids(mixed)[len(PROMPTS) :]
    if temperature > 0:
        assert len({tuple(ids) for ids in got}) > 1  # sampling really happened


def test_min_p_one_is_greedy_and_min_p_zero_is_plain(llm):
    greedy = token_ids(
        llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    )
    min_p_one = SamplingParams(temperature=1.0, seed=3, max_tokens=16, extra_args={"min_p": 1.0})
    assert token_ids(llm.generate(PROMPTS, min_p_one, use_tqdm=False)) == greedy
    plain = SamplingParams(temperature=1.0, seed=3, max_tokens=16)
    zero = SamplingParams(temperature=1.0, seed=3, max_tokens=16, extra_args={"min_p": 0.0})
    assert token_ids(llm.generate(PROMPTS, zero, use_tqdm=False)) == token_ids(
        llm.generate(PROMPTS, plain, use_tqdm=False)
    )


def test_mixed_batch_only_requests_with_options_change(llm):
    plain = [SamplingParams(temperature=1.0, seed=50 + i, max_tokens=16) for i in range(6)]
    alone = token_ids(llm.generate(PROMPTS, plain, use_tqdm=False))
    forced = [
        SamplingParams(
            temperature=1.0, seed=9, max_tokens=16, extra_args={"logit_bias": {40: 100.0}}
        ),
        SamplingParams(temperature=1.0, seed=9, max_tokens=16, extra_args={"min_p": 1.0}),
    ]
    mixed = token_ids(llm.generate(PROMPTS + PROMPTS[:2], plain + forced, use_tqdm=False))
    assert mixed[:6] == alone
    assert mixed[6] == [40] * 16


def test_requests_joining_and_finishing_at_different_times(llm):
    """Staggered joins and lengths through the engine's step loop; each request's own
    constraint holds whichever rows it occupied."""
    engine = llm.llm_engine
    rng = random.Random(5)
    expect: dict[str, object] = {}
    schedule: list[tuple[int, str, str, SamplingParams]] = []
    for i in range(24):
        join_step = rng.randrange(0, 30)
        prompt = rng.choice(PROMPTS)
        n = rng.randint(3, 20)
        kind = i % 3
        if kind == 0:
            token = rng.randrange(1000, 150_000)
            params = SamplingParams(
                temperature=1.0,
                seed=i,
                max_tokens=n,
                ignore_eos=True,
                extra_args={"logit_bias": {token: 100.0}},
            )
            expect[f"r{i}"] = [token] * n
        elif kind == 1:
            params = SamplingParams(
                temperature=0.8, seed=i, max_tokens=n, ignore_eos=True, extra_args={"min_p": 1.0}
            )
            expect[f"r{i}"] = ("greedy", prompt, n)
        else:
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=n, ignore_eos=True)
            expect[f"r{i}"] = n
        schedule.append((join_step, f"r{i}", prompt, params))

    results: dict[str, list[int]] = {}
    step = 0
    while step < 30 or engine.has_unfinished_requests():
        for join_step, rid, prompt, params in schedule:
            if join_step == step:
                engine.add_request(rid, prompt, params)
        for out in engine.step():
            if out.finished:
                results[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    assert set(results) == set(expect)
    greedy_cache: dict[tuple[str, int], list[int]] = {}
    for rid, want in expect.items():
        got = results[rid]
        if isinstance(want, list):
            assert got == want, rid
        elif isinstance(want, tuple):
            _, prompt, n = want
            if (prompt, n) not in greedy_cache:
                out = llm.generate(
                    [prompt],
                    SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                    use_tqdm=False,
                )
                greedy_cache[(prompt, n)] = token_ids(out)[0]
            assert got == greedy_cache[(prompt, n)], rid
        else:
            assert len(got) == want, rid


@pytest.mark.parametrize(
    ("extra_args", "field"),
    [
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"min_p": "0.1"}, "min_p"),
        ({"logit_bias": {"-1": 1.0}}, "logit_bias"),
        ({"logit_bias": {"151936": 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 101.0}}, "logit_bias"),
        ({"logit_bias": "{not json"}, "logit_bias"),
        ({"min_pp": 0.1}, "min_pp"),
    ],
)
def test_bad_options_raise_naming_the_field_and_engine_keeps_serving(llm, extra_args, field):
    with pytest.raises(VLLMValidationError, match=f"'{field}'") as info:
        llm.generate(["hi"], SamplingParams(max_tokens=2, extra_args=extra_args), use_tqdm=False)
    # vLLM re-raises every processor's ValueError as its VLLMValidationError; ours is the cause.
    assert isinstance(info.value.__cause__, OptionError)
    assert info.value.__cause__.field == field
    ok = llm.generate(
        ["hi"], SamplingParams(max_tokens=2, extra_args={"min_p": 0.1}), use_tqdm=False
    )
    assert len(ok[0].outputs[0].token_ids) >= 1


def test_option_and_builtin_twin_together_are_refused(llm):
    for params, field in [
        (SamplingParams(min_p=0.1, extra_args={"min_p": 0.1}), "min_p"),
        (SamplingParams(logit_bias={5: 1.0}, extra_args={"logit_bias": {5: 1.0}}), "logit_bias"),
    ]:
        with pytest.raises(VLLMValidationError, match=f"'{field}'.*built-in") as info:
            llm.generate(["hi"], params, use_tqdm=False)
        assert isinstance(info.value.__cause__, OptionError)


PENALTIES = [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 0.8},
    {"presence_penalty": 1.5},
    {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5},
    {"repetition_penalty": 0.8, "frequency_penalty": -0.5, "presence_penalty": -1.0},
    {"repetition_penalty": 2.0, "presence_penalty": 2.0},
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_penalties_equal_vllm_builtins(llm, temperature):
    """Default scope = vLLM's built-in penalties: same tokens, greedy and seeded, and in a
    batch that mixes built-in, ours and plain requests."""

    def params(values: dict, ours: bool, seed: int) -> SamplingParams:
        common = dict(temperature=temperature, seed=seed, max_tokens=32, ignore_eos=True)
        return (
            SamplingParams(**common, extra_args=values)
            if ours
            else SamplingParams(**common, **values)
        )

    builtin = [params(v, False, 10 + i) for i, v in enumerate(PENALTIES)]
    ours = [params(v, True, 10 + i) for i, v in enumerate(PENALTIES)]
    expected = token_ids(llm.generate(PROMPTS, builtin, use_tqdm=False))
    assert token_ids(llm.generate(PROMPTS, ours, use_tqdm=False)) == expected
    plain = [SamplingParams(temperature=temperature, seed=3, max_tokens=32)] * 3
    mixed = token_ids(
        llm.generate(PROMPTS + PROMPTS + PROMPTS[:3], ours + builtin + plain, use_tqdm=False)
    )
    assert mixed[:6] == mixed[6:12] == expected
    # The penalties really act: greedy without them repeats itself on this model.
    if temperature == 0.0:
        greedy = token_ids(
            llm.generate(
                PROMPTS,
                SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
                use_tqdm=False,
            )
        )
        assert greedy != expected


def test_windowed_repetition_penalty_allows_repeats_after_the_window(llm):
    """With a strong penalty on every token seen, greedy decoding cannot repeat a token while
    it is inside the window, and can once it has left it."""
    window = 4
    params = SamplingParams(
        temperature=0.0,
        max_tokens=40,
        ignore_eos=True,
        extra_args={
            "presence_penalty": 2.0,
            "frequency_penalty": 2.0,
            "repetition_penalty": 2.0,
            "penalty_last_n": window,
            "penalty_scope": "output",
        },
    )
    for ids in token_ids(llm.generate(PROMPTS, params, use_tqdm=False)):
        # Penalties of 2 on logits spread over ~1 unit: a token never repeats within the window.
        assert all(ids[i] not in ids[max(0, i - (window - 1)) : i] for i in range(len(ids)))
        assert len(set(ids)) < len(ids)  # ...but does come back after leaving it


@pytest.mark.parametrize(
    ("extra_args", "field"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": float("inf")}, "presence_penalty"),
        ({"penalty_last_n": -1}, "penalty_last_n"),
        ({"penalty_last_n": 1.5}, "penalty_last_n"),
        ({"penalty_scope": "prompt"}, "penalty_scope"),
    ],
)
def test_bad_penalty_options_are_refused(llm, extra_args, field):
    with pytest.raises(VLLMValidationError, match=f"'{field}'"):
        llm.generate(["hi"], SamplingParams(max_tokens=2, extra_args=extra_args), use_tqdm=False)


@pytest.mark.parametrize("field", ["repetition_penalty", "frequency_penalty", "presence_penalty"])
def test_penalty_and_its_builtin_twin_are_refused(llm, field):
    params = SamplingParams(max_tokens=2, extra_args={field: 1.5}, **{field: 1.2})
    with pytest.raises(VLLMValidationError, match=f"'{field}'.*built-in"):
        llm.generate(["hi"], params, use_tqdm=False)
