"""DRY against a line-by-line Python port of llama.cpp's ``llama_sampler_dry_apply`` (the
Z-algorithm, restart sequences, the exponent clamp), on simulated V1 batches, every row of
every step; unit tests; refusals. V2: ``tests/v2_real/`` (scenario ``dry_sampler``)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from constrained import Options
from constrained.options import OptionError
from constrained.processors.dry import DryProcessor
from constrained.processors.functional import PENALTY_LIMIT_LOGIT
from tests.simulate import Request, V1Batch, fake_vllm_config
from tests.v2_real import run_cases

VOCAB = 19  # small, so random sequences repeat
CAPACITY = 10
MAX_MODEL_LEN = 512
# Token texts of the simulated vocabulary: some contain a default breaker (":", "\n", ...).
TEXTS = [f"t{i}".encode() for i in range(VOCAB)]
TEXTS[3], TEXTS[7], TEXTS[11], TEXTS[15] = b"a:", b"\n", b'"q', b"x*y"
BREAKERS = {3, 7, 11, 15}  # for llama.cpp's default breakers


def dry_reference(
    tokens: list[int],
    logits: torch.Tensor,
    multiplier: float,
    base: float,
    allowed: int,
    last_n: int,
    breakers: set[int],
    context_size: int = MAX_MODEL_LEN,
) -> torch.Tensor:
    """``llama_sampler_dry_apply`` (llama.cpp src/llama-sampling.cpp), single-token breakers,
    each result kept at ``-PENALTY_LIMIT_LOGIT`` or above (ours: a penalty is a finite push)."""
    out = logits.clone()
    mult32, base32 = np.float32(multiplier), np.float32(base)
    if mult32 == 0 or base32 < 1 or last_n == 0:
        return out
    effective = context_size if last_n == -1 else max(last_n, 0)
    last_tokens = tokens[-effective:]
    last_n_repeat = min(len(last_tokens), effective, context_size)
    if last_n_repeat <= allowed:
        return out

    def rat(i: int) -> int:
        return last_tokens[len(last_tokens) - 1 - i]

    rep_limit = last_n_repeat
    for i in range(last_n_repeat):
        if rat(i) in breakers:
            rep_limit = i
            break
    if rep_limit < allowed:
        return out
    count = [0] * last_n_repeat
    last = last_n_repeat - 1
    rt = lt = 0
    for k in range(1, last_n_repeat):
        if k > rt:
            n = 0
            while n + k < last_n_repeat and rat(n) == rat(n + k):
                n += 1
            count[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if count[last - p] < right_part_len:
                count[last - k] = min(count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < last_n_repeat and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    max_repeat: dict[int, int] = {}
    for i in range(last_n_repeat - 1):
        if count[i] >= allowed:
            token = rat(last_n_repeat - 2 - i)
            max_repeat[token] = max(max_repeat.get(token, 0), count[i])
    max_exponent = 0
    if base32 > np.float32(1.000001):
        max_exponent = int(np.float32(88.7228391) / np.log(base32))
    for token, repeat_len in max_repeat.items():
        if token in breakers:
            continue
        exponent = repeat_len - allowed
        if max_exponent > 0 and exponent > max_exponent:
            exponent = max_exponent
        penalty = np.float32(float(mult32) * float(base32) ** exponent)
        before = np.float32(out[token].item())
        with np.errstate(over="ignore"):
            after = max(before - penalty, min(before, np.float32(-PENALTY_LIMIT_LOGIT)))
        out[token] = torch.tensor(after)
    return out


def make_processor() -> DryProcessor:
    cfg = fake_vllm_config(CAPACITY, VOCAB)
    cfg.model_config.max_model_len = MAX_MODEL_LEN
    proc = DryProcessor(cfg, torch.device("cpu"), False)
    proc.breakers.token_bytes = lambda: TEXTS
    return proc


def breaker_ids(breakers: list[str] | None) -> set[int]:
    needles = [b.encode() for b in (breakers if breakers is not None else ["\n", ":", '"', "*"])]
    return {t for t, text in enumerate(TEXTS) if any(n in text for n in needles)}


def random_params(rng: random.Random) -> SamplingParams:
    extra: dict = {}
    if rng.random() < 0.8:
        # 1e38: penalties past float32's range, held at the limit
        extra["dry_multiplier"] = rng.choice([0.0, 0.8, 1.5, 3.0, 1e38])
        if rng.random() < 0.7:
            extra["dry_base"] = rng.choice([1.0, 1.000001, 1.1, 1.75, 3.0])
        if rng.random() < 0.7:
            extra["dry_allowed_length"] = rng.choice([1, 2, 3, 5])
        if rng.random() < 0.7:
            extra["dry_penalty_last_n"] = rng.choice([-1, 0, 4, 16, 64])
        if rng.random() < 0.4:
            extra["dry_sequence_breakers"] = rng.choice([[], [":"], ["\n", "q"], ["x", "y"]])
    return SamplingParams(temperature=rng.choice([0.0, 1.0]), extra_args=extra or None)


def expected(logits: torch.Tensor, req: Request) -> torch.Tensor:
    extra = req.params.extra_args or {}
    if not extra.get("dry_multiplier"):
        return logits.clone()
    return dry_reference(
        req.prompt + req.output,
        logits,
        extra["dry_multiplier"],
        extra.get("dry_base", 1.75),
        extra.get("dry_allowed_length", 2),
        extra.get("dry_penalty_last_n", -1),
        breaker_ids(extra.get("dry_sequence_breakers")),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v1_random_batches_match_llama_cpp(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    proc = make_processor()
    batch = V1Batch(CAPACITY, rng)
    next_id, rows, penalized = 0, 0, 0
    for step in range(1000):
        new = []
        for _ in range(rng.randint(0, 2)):
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.3:  # repetitive prompts: long repeats, the clamp
                prompt = prompt[:3] * 20
            new.append(Request(next_id, random_params(rng), prompt))
            next_id += 1
        proc.update_state(batch.step(new))
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), VOCAB) * 3
        actual = proc.apply(logits.clone())
        for i, req in enumerate(batch.rows):
            want = expected(logits[i], req)
            where = f"step {step} row {i} req {req.req_id} {req.params.extra_args}"
            assert torch.equal(actual[i].view(torch.int32), want.view(torch.int32)), (
                where,
                (actual[i] - want).abs().max(),
            )
            rows += 1
            penalized += not torch.equal(want, logits[i])
            # Mostly repeat the row's own recent tokens, so repeats keep growing.
            history = req.prompt + req.output
            if rng.random() < 0.7 and len(history) > 3:
                req.output.append(history[-rng.choice([2, 3, 4])])
            else:
                req.output.append(rng.randrange(VOCAB))
    assert rows > 3000 and penalized > 800


def test_llama_cpp_example_and_clamp() -> None:
    """llama.cpp's documented example (a b c c b c y a b c): c, b, y would extend repeats."""
    proc = make_processor()
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    a, b, c, y = 1, 2, 4, 9
    prompt = [a, b, c, c, b, c, y, a, b, c]
    params = SamplingParams(extra_args={"dry_multiplier": 1.0, "dry_allowed_length": 1})
    proc.update_state(
        BatchUpdate(batch_size=1, removed=[], added=[(0, params, prompt, [])], moved=[])
    )
    out = proc.apply(torch.zeros(1, VOCAB))[0]
    # c extends "a b c" (3): 1.75^2; y extends "b c" (2): 1.75; b extends "c" (1): 1.
    assert out[c].item() == pytest.approx(-(1.75**2))
    assert out[y].item() == pytest.approx(-1.75)
    assert out[b].item() == pytest.approx(-1.0)
    assert out[a].item() == 0.0


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"dry_multiplier": -1}, "dry_multiplier"),
        ({"dry_multiplier": 1, "dry_base": 0.5}, "dry_base"),
        ({"dry_multiplier": 1, "dry_allowed_length": 0}, "dry_allowed_length"),
        ({"dry_multiplier": 1, "dry_penalty_last_n": -2}, "dry_penalty_last_n"),
        ({"dry_multiplier": 1, "dry_sequence_breakers": ["ab"]}, "dry_sequence_breakers"),
        ({"dry_multiplier": 1, "dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_base": 1.5}, "dry_base"),
        ({"dry_multiplier": float("inf")}, "dry_multiplier"),
    ],
)
def test_bad_values_are_refused_naming_the_field(extra: dict, field: str) -> None:
    with pytest.raises(OptionError) as err:
        Options.from_extra_args(extra)
    assert err.value.field == field


def test_v2_kernels_match_the_torch_form_bit_for_bit() -> None:
    """DRY's V2 Triton kernels (``dry_kernel.py``), run in Triton's interpreter in a fresh
    process over generated steps (``tests/v2_real/dry_kernel_cases.py``: random repetitive
    histories, breaker lists or none, windows, allowed lengths, bases with and without the
    exponent clamp, caps, slots without DRY, draft rows and ``-1`` placeholder drafts, rows
    split over several programs), give the logits the torch form (``device_history`` +
    ``repeat_lengths`` + ``dry_penalize``) gives, bit for bit; and ``multiplier * base ** e``
    equals torch's float64 ``pow`` on every value tried."""
    stats = run_cases("dry_kernel_cases", "DRYKERNEL", "120")
    assert stats["mismatches"] == [], stats["mismatches"][:1]
    assert stats["pow_mismatch_count"] == 0, stats["pow_mismatches"]
    # the cases reach what they are for
    assert stats["cases"] == 120
    assert stats["rows_penalized"] >= 100, stats
    assert stats["draft_rows_penalized"] >= 30, stats
    assert stats["placeholder_rows"] >= 20, stats
    assert stats["multi_chunk_cases"] >= 20, stats
    assert stats["inactive_rows"] >= 40, stats
    assert stats["no_breaker_cases"] >= 20, stats
    assert stats["pow_finite"] >= 19000, stats
