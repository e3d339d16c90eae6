"""no_repeat_ngram_size against a per-request reference (vLLM's DeepSeek-OCR processor, ported
as plain Python) on simulated V1 batches, every row of every step; unit tests of the math;
the DeepSeek-OCR option names; refusals. V2: ``tests/v2_real/`` (scenario ``ngram_sampler``)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from vllm import SamplingParams

from constrained import Options
from constrained.options import OptionError
from constrained.processors.ngram_math import ban_tokens, repeated_ngram_bans
from constrained.processors.no_repeat_ngram import NoRepeatNGramProcessor
from tests.simulate import Request, V1Batch, fake_vllm_config
from tests.v2_real import run_cases

VOCAB = 23  # small, so random outputs repeat n-grams often
CAPACITY = 10


def banned_reference(output: list[int], n: int, window: int | None, whitelist: set[int]) -> set:
    """vLLM's DeepSeek-OCR ``NoRepeatNGramLogitsProcessor.__call__`` (output tokens only);
    for n = 1, HF's rule (every token in the window), where vLLM's bans nothing."""
    window = window or len(output)
    if len(output) < n:
        return set()
    if n == 1:
        return set(output[max(0, len(output) - window) :]) - whitelist
    prefix = tuple(output[-(n - 1) :])
    start, end = max(0, len(output) - window), len(output) - n + 1
    banned = {
        output[i + n - 1] for i in range(start, end) if tuple(output[i : i + n - 1]) == prefix
    }
    return banned - whitelist


def expected_row(logits: torch.Tensor, req: Request) -> torch.Tensor:
    extra = req.params.extra_args or {}
    out = logits.clone()
    n = extra.get("no_repeat_ngram_size")
    if n is None:
        return out
    banned = banned_reference(
        req.output, n, extra.get("ngram_window"), set(extra.get("ngram_whitelist") or ())
    )
    for token in banned:
        out[token] = -math.inf
    if not bool(torch.isfinite(out).any()):  # never leave a row with nothing to sample
        return logits.clone()
    return out


def random_params(rng: random.Random) -> SamplingParams:
    extra: dict = {}
    if rng.random() < 0.8:
        extra["no_repeat_ngram_size"] = rng.choice([1, 2, 2, 3, 4, 6])
        if rng.random() < 0.5:
            extra["ngram_window"] = rng.choice([1, 3, 8, 20])
        if rng.random() < 0.3:
            extra["ngram_whitelist"] = rng.sample(range(VOCAB), rng.randint(1, 4))
    return SamplingParams(temperature=rng.choice([0.0, 1.0]), extra_args=extra or None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v1_random_batches_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    proc = NoRepeatNGramProcessor(fake_vllm_config(CAPACITY, VOCAB), torch.device("cpu"), False)
    batch = V1Batch(CAPACITY, rng)
    next_id, rows, banned_rows, kept_rows = 0, 0, 0, 0
    for step in range(1200):
        new = [
            Request(next_id + k, random_params(rng), [rng.randrange(VOCAB) for _ in range(4)])
            for k in range(rng.randint(0, 2))
        ]
        next_id += len(new)
        proc.update_state(batch.step(new))
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), VOCAB)
        for r in range(len(batch.rows)):  # some rows as a grammar leaves them: a few tokens
            if rng.random() < 0.2:
                keep = torch.zeros(VOCAB, dtype=torch.bool)
                keep[rng.sample(range(VOCAB), rng.randint(1, 3))] = True
                logits[r, ~keep] = -math.inf
        actual = proc.apply(logits.clone())
        for i, req in enumerate(batch.rows):
            want = expected_row(logits[i], req)
            where = f"step {step} row {i} req {req.req_id} {req.params.extra_args} {req.output}"
            assert torch.equal(actual[i].view(torch.int32), want.view(torch.int32)), where
            rows += 1
            changed = not torch.equal(want, logits[i])
            banned_rows += changed
            kept_rows += (not changed) and bool(req.params.extra_args) and len(req.output) > 6
            req.output.append(rng.randrange(VOCAB))
    assert rows > 4000 and banned_rows > 1000 and kept_rows > 100


def test_bans_never_empty_a_row() -> None:
    logits = torch.full((1, 5), -math.inf)
    logits[0, 2] = 1.0  # a grammar allows only token 2
    history = torch.tensor([[2, 2]])
    banned = repeated_ngram_bans(history, torch.tensor([2]), torch.empty(1, 0), 2)
    assert banned.tolist() == [[False, True]]
    assert ban_tokens(logits.clone(), history, banned)[0, 2] == 1.0


def test_math_window_whitelist_and_short_rows() -> None:
    h = torch.tensor([[-1, -1, 4, 5, 4], [7, 8, 7, 8, 7], [-1, -1, -1, -1, 3]])
    n = torch.tensor([2, 3, 2])
    none = torch.full((3, 1), -1)
    assert repeated_ngram_bans(h, n, none, 3).tolist() == [
        [False, False, False, True, False],  # "4 5" seen: 5 banned after 4
        [False, False, False, True, False],  # prefix "8 7": "8 7 8" seen, so 8 (at 3)
        [False, False, False, False, False],  # one token: nothing to repeat
    ]
    white = torch.tensor([[5], [-1], [-1]])
    assert not repeated_ngram_bans(h, n, white, 3)[0].any()


def test_deepseek_ocr_names_are_accepted_with_their_default_window() -> None:
    options = Options.from_extra_args({"ngram_size": 30, "whitelist_token_ids": {128821}})
    assert options.no_repeat_ngram_size == 30
    assert options.ngram_window == 100  # vLLM's NGramPerReqLogitsProcessor default
    assert options.ngram_whitelist == [128821]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"no_repeat_ngram_size": 0}, "no_repeat_ngram_size"),
        ({"no_repeat_ngram_size": 65}, "no_repeat_ngram_size"),
        ({"no_repeat_ngram_size": 2.0}, "no_repeat_ngram_size"),
        ({"no_repeat_ngram_size": 2, "ngram_window": 0}, "ngram_window"),
        ({"ngram_window": 5}, "ngram_window"),
        ({"no_repeat_ngram_size": 2, "ngram_whitelist": ["a"]}, "ngram_whitelist"),
        ({"ngram_size": -1}, "ngram_size"),
        ({"ngram_size": 3, "no_repeat_ngram_size": 3}, "ngram_size"),
        ({"window_size": 5}, "window_size"),
    ],
)
def test_bad_values_are_refused_naming_the_field(extra: dict, field: str) -> None:
    with pytest.raises(OptionError) as err:
        Options.from_extra_args(extra)
    assert err.value.field == field


def test_v2_kernel_matches_the_torch_path_bit_for_bit() -> None:
    """The Triton kernel V2 uses (``processors/ngram_kernel.py``), run in Triton's interpreter
    in a fresh process (``tests/v2_real/ngram_kernel_cases.py``), gives exactly the torch
    path's logits on 260 generated steps, and those steps cover what can go differently."""
    result = run_cases("ngram_kernel_cases", "NGRAMKERNEL")
    assert result["mismatches"] == []
    covered = result["covered"]
    minimums = {
        "rows_off": 100, "rows_banning_n1": 50, "rows_banning_n2": 50, "rows_banning_n3": 20,
        "rows_banning_n4": 10, "rows_banning_n6": 5, "draft_rows_banning": 50,
        "placeholder_rows": 50, "whitelisted_rows": 100, "windowed_rows_banning": 50,
        "plain_rows_banned": 100, "one_left_rows_banned": 20, "only_bans_rows_kept_whole": 20,
        "all_masked_rows_kept_whole": 20, "wide_vocab_rows_banning": 20,
        "tight_width_steps": 50, "zero_width_steps": 5,
    }  # fmt: skip
    short = {k: covered.get(k, 0) for k, want in minimums.items() if covered.get(k, 0) < want}
    assert not short, short
