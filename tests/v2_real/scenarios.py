"""Scenarios on vLLM's real V2 sampler (see ``harness``): ``python -m tests.v2_real.scenarios X``.

Each scenario asserts as it goes (exit status 1 and a message naming the step, row and request
on the first mismatch) and ends by printing one ``V2REAL {json}`` line of counts, which the
pytest side checks are large enough that nothing passed vacuously.

Real vLLM: request state, our processors as vLLM's loader builds them, the ``Sampler`` with its
built-in stages, the runner's input kernels, ``gather_draft_sampled``, ``post_update``.
Simulated: the scheduler, the model (random logits), the drafter, the accept/sample decision.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import math
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from vllm import SamplingParams

from constrained.processors.functional import PENALTY_LIMIT_LOGIT
from tests.v2_real.harness import Plan, Req, V2Runner, sample_step, tensor_bytes
from tests.v2_real.sync_guard import row_hashes

SCENARIOS: dict[str, Callable[[], dict]] = {}


def scenario(fn: Callable[[], dict]) -> Callable[[], dict]:
    SCENARIOS[fn.__name__] = fn
    return fn


def own_draws(seed: int) -> torch.Generator:
    """A scenario's random logits come from a generator of its own: vLLM's set-up and a GPU's
    first kernels draw from torch's global one (once per process), which made a GPU's walk
    differ from the CPU's and the second of two ranks' logits differ from the first's."""
    return torch.Generator().manual_seed(seed)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# ---- references ------------------------------------------------------------------------


def penalised(
    logits: torch.Tensor,
    prompt: list[int],
    output: list[int],
    extra: dict,
) -> torch.Tensor:
    """Bias, then penalties over the tokens ``penalty_scope`` / ``penalty_last_n`` count, in
    the float32 operations of vLLM's V2 ``_penalties_kernel`` (``l *= 1/r`` for ``l > 0``),
    the repetition's product kept within ``+-PENALTY_LIMIT_LOGIT``."""
    vocab = logits.shape[0]
    out = logits.clone()
    for token, bias in (extra.get("logit_bias") or {}).items():
        out[int(token)] += torch.tensor(bias, dtype=torch.float32)
    rep = torch.tensor(extra.get("repetition_penalty", 1.0), dtype=torch.float32)
    freq = torch.tensor(extra.get("frequency_penalty", 0.0), dtype=torch.float32)
    pres = torch.tensor(extra.get("presence_penalty", 0.0), dtype=torch.float32)
    if rep == 1 and freq == 0 and pres == 0:
        return out
    window = extra.get("penalty_last_n") or 0
    scope = extra.get("penalty_scope") or "default"
    sequence = prompt + output
    start = max(0, len(sequence) - window) if window else 0
    in_prompt = [t for i, t in enumerate(sequence) if start <= i < len(prompt)]
    in_output = [t for i, t in enumerate(sequence) if i >= max(start, len(prompt))]
    if scope == "output":
        in_prompt = []
    elif scope == "prompt_and_output":
        in_prompt, in_output = [], in_prompt + in_output
    counts = torch.bincount(torch.tensor(in_output, dtype=torch.int64), minlength=vocab)
    counts = counts.to(torch.int32)
    prompt_seen = torch.bincount(torch.tensor(in_prompt, dtype=torch.int64), minlength=vocab) > 0
    seen = (counts > 0) | prompt_seen
    one = torch.tensor(1.0, dtype=torch.float32)
    scale = torch.where(seen, rep, one)
    low, high = out.clamp(max=-PENALTY_LIMIT_LOGIT), out.clamp(min=PENALTY_LIMIT_LOGIT)
    out = out * torch.where(out > 0, one / scale, scale)
    out = torch.minimum(torch.maximum(out, low), high)
    out = out - freq * counts.to(torch.float32)
    return out - pres * (counts > 0).to(torch.float32)


def divided(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """``l / T`` as vLLM's own ``apply_temperature`` computes it, on the row's device (skipped
    for T = 0 or 1). Not ``row / T``: Triton's float32 ``/`` is exact in the interpreter but
    ``div.full.f32`` (up to 2 ulp off) on NVIDIA GPUs, which made the truncation check see
    "kept values changed" on CUDA only (#28)."""
    if temperature in (0.0, 1.0):
        return row
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature

    device = harness.DEVICE  # the kernel runs where the runner's kernels run
    out = row.reshape(1, -1).to(device, copy=True)
    index = torch.zeros(1, dtype=torch.int64, device=device)
    apply_temperature(out, index, torch.tensor([temperature], device=device))
    return out[0].to(row.device)


def inert(processor: object) -> bool:
    """An entry-point copy of ours that stays inert because the flag names ours (plugin.py)."""
    return bool(getattr(processor, "inert", False))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


# CUDA's float32 division in Triton kernels (``div.full.f32``) is within 2 ulp of the exact
# quotient; the interpreter divides exactly. A CPU reference that divides (the repetition
# penalty's ``l / r``) is compared on a GPU within 2 ulp of that quotient (what the later
# subtractions and the temperature leave of it: at most ``2 * 2**-23 * |l| / min(T, 1)``),
# bitwise on CPU.
DIVISION_ULPS = 0 if harness.INTERPRETED else 2


def within_division_rounding(
    a: torch.Tensor, b: torch.Tensor, raw: torch.Tensor, temperature: float
) -> bool:
    """Bitwise on CPU; on a GPU, the same non-finite entries and finite ones within the
    division's rounding of the raw logit ``raw`` (see ``DIVISION_ULPS``)."""
    if DIVISION_ULPS == 0 or bits_equal(a, b):
        return bits_equal(a, b)
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)) or not torch.equal(a[~finite], b[~finite]):
        return False
    scale = 1.0 / min(temperature, 1.0) if temperature > 0 else 1.0
    tolerance = DIVISION_ULPS * 2.0**-23 * raw[finite].abs() * scale
    return bool(((a[finite] - b[finite]).abs() <= tolerance).all())


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    both = torch.isfinite(a) & torch.isfinite(b)
    diff = (a[both] - b[both]).abs()
    return float(diff.max()) if diff.numel() else 0.0


def random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


# ---- scheduling helpers ----------------------------------------------------------------


def plan_for(req: Req, rng: random.Random, num_spec: int, drafts: list[int]) -> Plan:
    """A random plan: a prefill chunk, or a decode step with ``drafts``.

    A final prefill chunk sometimes comes padded with ``num_spec`` placeholder draft slots, as
    vLLM's scheduler pads a new request with one token left to compute (prefix or remote KV
    hit) to the uniform ``1 + num_spec`` decode shape; here for final chunks of any size."""
    if req.prefilling:
        remaining = req.prefill_len - req.computed
        chunk = remaining if rng.random() < 0.5 else rng.randint(1, remaining)
        pad = num_spec if chunk == remaining and rng.random() < 0.4 else 0
        return Plan(prefill=chunk, placeholders=pad)
    return Plan(drafts=drafts)


def prefix_hit(rng: random.Random, length: int) -> int:
    """Now and then a prefix-cache hit: sometimes all but one token (the case vLLM pads with
    placeholder drafts), sometimes part of the prefill."""
    if length < 3 or rng.random() >= 0.25:
        return 0
    return length - 1 if rng.random() < 0.5 else rng.randrange(1, length - 1)


def admit_fresh(runner: V2Runner, req: Req, rng: random.Random) -> None:
    runner.admit(req, prefix_hit(rng, len(req.tokens)))


def turn_over(
    runner: V2Runner,
    reqs: list[Req],
    parked: list[Req],
    rng: random.Random,
    *,
    max_output: int,
    drop: float,
    max_new: int,
    make: Callable[[], Req],
    eos: int | None = None,
) -> set[str]:
    """One step of a scenario's request life: finish requests that are done (``max_output``
    tokens, or ``eos`` sampled) or, at random, preempt them (parked with their output), resume
    a parked one now and then, admit up to ``max_new`` new ones from ``make``. A request
    admitted but not yet in a step (no slot) is left alone. Returns the ids admitted this
    step."""
    for req in list(reqs):
        if req.slot is None:
            continue
        ended = len(req.output) >= max_output or (eos is not None and eos in req.output)
        if ended or rng.random() < drop:
            runner.finish(req)
            reqs.remove(req)
            if not ended and req.output:
                parked.append(req)
    fresh: set[str] = set()
    if parked and runner.num_admitted < runner.max_num_reqs and rng.random() < 0.4:
        req = parked.pop(0)
        reqs.append(req)
        admit_fresh(runner, req, rng)
        fresh.add(req.req_id)
    for _ in range(rng.randint(0, max_new)):
        if runner.num_admitted >= runner.max_num_reqs:
            break
        req = make()
        reqs.append(req)
        admit_fresh(runner, req, rng)
        fresh.add(req.req_id)
    return fresh


def decode_plans(
    reqs: list[Req],
    fresh: set[str],
    rng: random.Random,
    num_spec: int,
    drafts_for: Callable[[Req], list[int]],
) -> dict[str, Plan]:
    """Schedule each live request (new ones always, others 9 times in 10) with its drafts."""
    plans: dict[str, Plan] = {}
    for req in reqs:
        if req.req_id in fresh or rng.random() < 0.9:
            plans[req.req_id] = plan_for(req, rng, num_spec, drafts_for(req))
    return plans


# ---- 1. built-in equivalence -------------------------------------------------------------


BUILTIN_VOCAB = 4096


def twin_options(rng: random.Random, vocab: int) -> dict:
    extra: dict = {}
    if rng.random() < 0.6:
        extra["logit_bias"] = {
            rng.randrange(vocab): round(rng.uniform(-30, 30), 3) for _ in range(rng.randint(1, 6))
        }
    if rng.random() < 0.75:
        extra["repetition_penalty"] = rng.choice([1.0, 0.7, 1.3, 2.0])
        extra["frequency_penalty"] = rng.choice([0.0, -1.5, 0.5, 2.0])
        extra["presence_penalty"] = rng.choice([0.0, -0.5, 1.0])
    if rng.random() < 0.4:
        extra["min_p"] = rng.choice([0.05, 0.3, round(rng.uniform(0.01, 0.9), 4)])
    return extra or {"frequency_penalty": 0.5}


def builtin_params(extra: dict, temperature: float) -> SamplingParams:
    """The same options as vLLM's own ``SamplingParams`` fields."""
    return SamplingParams(
        temperature=temperature,
        logit_bias=extra.get("logit_bias"),
        repetition_penalty=extra.get("repetition_penalty", 1.0),
        frequency_penalty=extra.get("frequency_penalty", 0.0),
        presence_penalty=extra.get("presence_penalty", 0.0),
        min_p=extra.get("min_p", 0.0),
    )


def solo_options(rng: random.Random, vocab: int, extremes: bool = False) -> dict:
    """``extremes``: repetition penalties of 1e30 / 1e-30 too (the range's ends: products past
    the limit, held there); off keeps the random stream other scenarios' counts were set on."""
    penalties = [0.7, 1.3, 2.0, 1e30, 1e-30] if extremes else [0.7, 1.3, 2.0]
    extra = {
        "repetition_penalty": rng.choice(penalties),
        "frequency_penalty": rng.choice([0.0, -1.5, 0.5, 2.0]),
        "presence_penalty": rng.choice([0.0, -0.5, 1.0]),
        "penalty_last_n": rng.choice([0, 1, 2, 3, 8]),
        "penalty_scope": rng.choice(["default", "output", "prompt_and_output"]),
    }
    if rng.random() < 0.3:
        extra["logit_bias"] = {rng.randrange(vocab): 5.0}
    return extra


def run_twins(
    *,
    seed: int,
    steps: int,
    num_spec: int,
    capacity: int,
    prompt_range: tuple[int, int],
    placeholder_only: bool = False,
) -> dict:
    """Shared body of ``builtin_equivalence`` and ``penalty_placeholders``.

    Groups of requests run in lockstep: a twin pair (ours via ``extra_args``, vLLM's via its
    own fields; same prompt, same plans, same logits rows, same committed tokens), a solo with
    a window or scope of ours (checked against ``penalised``), or a plain request."""
    rng = random.Random(seed)
    draws = own_draws(seed)
    vocab = BUILTIN_VOCAB
    started = time.monotonic()
    config = harness.make_vllm_config(capacity, num_spec, 256, 512)
    runner = V2Runner(
        config,
        max_num_reqs=capacity,
        vocab_size=vocab,
        num_spec=num_spec,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    footprint = tensor_bytes(runner.custom)
    stats = {
        "setup_seconds": round(time.monotonic() - started, 1),
        "twin_rows": 0,
        "twin_rows_processed": 0,
        "twin_draft_rows": 0,
        "twin_placeholder_rows": 0,
        "twin_placeholder_rows_penalised": 0,
        "twin_min_p_rows": 0,
        "twin_t07_rows": 0,
        "solo_rows": 0,
        "solo_window_rows": 0,
        "solo_draft_rows": 0,
        "solo_placeholder_rows": 0,
        "plain_rows": 0,
        "reference_vs_builtin_rows": 0,
        "top_token_rows": 0,
        "builtin_penalty_changed_rows": 0,  # vLLM's own penalties did change the row
    }
    top = vocab - 1  # never in prompts, drafts or samples: only a misread -1 would count it
    active: list[tuple[str, list[Req]]] = []  # (kind, requests in lockstep)
    parked: list[tuple[str, list[Req]]] = []  # preempted, resumed later with their output
    next_id = 0

    def new_req(name: str, params: SamplingParams, prompt: list[int], extra: dict) -> Req:
        nonlocal next_id
        next_id += 1
        return Req(f"{name}{next_id}", params, list(prompt), tag=extra)

    for step_no in range(steps):
        # -- finish or preempt whole groups --
        for group in list(active):
            head = group[1][0]
            done = len(head.output) >= (6 if placeholder_only else 24)
            roll = rng.random()
            if done or roll < 0.1:
                for req in group[1]:
                    runner.finish(req)
                active.remove(group)
                if not done and roll < 0.04 and head.output and not placeholder_only:
                    parked.append(group)
        # -- admit: resumed groups, then new ones (always scheduled in their first step) --
        fresh: set[str] = set()
        if parked and runner.num_admitted + len(parked[0][1]) <= capacity and rng.random() < 0.5:
            group = parked.pop(0)
            hit = prefix_hit(rng, len(group[1][0].tokens))
            for req in group[1]:
                runner.admit(req, hit)
                fresh.add(req.req_id)
            active.append(group)
        for _ in range(rng.randint(0, 3)):
            roll = rng.random()
            prompt = random_tokens(rng, rng.randint(*prompt_range), top)
            temperature = rng.choice([1.0, 0.7])
            if roll < 0.6 and runner.num_admitted + 2 <= capacity:
                extra = twin_options(rng, top)
                ours = SamplingParams(temperature=temperature, extra_args=extra)
                theirs = builtin_params(extra, temperature)
                pair = [
                    new_req("ours", ours, prompt, extra),
                    new_req("vllm", theirs, prompt, extra),
                ]
                group = ("twin", pair)
            elif roll < 0.85 and runner.num_admitted + 1 <= capacity:
                extra = solo_options(rng, top, extremes=True)
                params = SamplingParams(temperature=temperature, extra_args=extra)
                group = ("solo", [new_req("solo", params, prompt, extra)])
            elif runner.num_admitted + 1 <= capacity:
                group = ("plain", [new_req("plain", SamplingParams(temperature=1.0), prompt, {})])
            else:
                continue
            hit = prefix_hit(rng, len(prompt))
            for req in group[1]:
                runner.admit(req, hit)
                fresh.add(req.req_id)
            active.append(group)
        # -- schedule: a group shares one plan --
        plans: dict[str, Plan] = {}
        for _, reqs in active:
            if reqs[0].req_id in fresh or rng.random() < 0.9:
                plan = twin_plan(reqs[0], rng, num_spec, top, placeholder_only)
                for req in reqs:
                    plans[req.req_id] = Plan(plan.prefill, list(plan.drafts), plan.placeholders)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, vocab, generator=draws) * 3
        # positive: repetition would divide
        logits[:, top] = 4.0 + torch.rand(step.num_rows, generator=draws)
        rows_of = {req.req_id: step.rows_of(req) for req in step.reqs}
        scheduled = [(kind, reqs) for kind, reqs in active if reqs[0].req_id in rows_of]
        for kind, reqs in scheduled:
            if kind == "twin":
                for ra, rb in zip(rows_of[reqs[0].req_id], rows_of[reqs[1].req_id], strict=True):
                    logits[ra.index] = logits[rb.index]
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 3, 5]))
        where = f"step {step_no} (runner step {step.number})"
        for kind, reqs in scheduled:
            if kind == "twin":
                check_twin(stats, where, reqs, rows_of, logits, processed, top)
            elif kind == "solo":
                check_solo(stats, where, reqs[0], rows_of, logits, processed, top)
            else:
                for row in rows_of[reqs[0].req_id]:
                    check(
                        bits_equal(processed[row.index], logits[row.index]),
                        f"{where} {reqs[0].req_id} local {row.local}: plain row changed",
                    )
                    stats["plain_rows"] += 1
        # -- sample from vLLM's row (never token vocab-1); twins share the outcome --
        decide_on = processed.clone()
        others = torch.isfinite(decide_on[:, :top]).any(dim=1)
        decide_on[others, top] = -math.inf
        followers = {reqs[0].req_id: reqs[1].req_id for kind, reqs in scheduled if kind == "twin"}
        leaders = {r.req_id for r in step.reqs} - set(followers)
        accepted = sample_step(step, decide_on, rng, leaders=leaders)
        for ours_id, vllm_id in followers.items():
            if vllm_id in accepted:
                accepted[ours_id] = list(accepted[vllm_id])
        runner.commit(step, accepted)
        grown = tensor_bytes(runner.custom) - footprint
        table = capacity * vocab * 4
        check(
            grown < table // 2,
            f"{where}: our processors hold {grown} bytes more than after construction (a "
            f"[slots, vocab] int32 table is {table}): memory that vLLM's start-up profile, "
            "which sizes the KV cache, did not see",
        )
        stats["footprint_growth_bytes"] = grown
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


def check_twin(stats, where, reqs, rows_of, logits, processed, top) -> None:
    """Our row (extra_args) must be vLLM's built-in row for the same options."""
    a, b = reqs
    extra = a.tag
    for ra, rb in zip(rows_of[a.req_id], rows_of[b.req_id], strict=True):
        got, want = processed[ra.index], processed[rb.index]
        raw = divided(logits[rb.index], b.params.temperature)
        at = f"{where} {a.req_id}/{b.req_id} local {ra.local} {extra}"
        stats["twin_rows"] += 1
        stats["twin_draft_rows"] += ra.local > 0 and not ra.placeholder
        stats["twin_placeholder_rows"] += ra.placeholder
        stats["twin_t07_rows"] += a.params.temperature != 1.0
        stats["twin_rows_processed"] += not bits_equal(want, raw)  # vLLM did change it
        if extra.get("min_p"):
            stats["twin_min_p_rows"] += 1
            kept_a, kept_b = torch.isfinite(got), torch.isfinite(want)
            differ = (kept_a != kept_b).nonzero().flatten().tolist()
            check(not differ, f"{at}: min_p keeps tokens {differ[:8]} differently")
            check(
                bits_equal(got[kept_a], want[kept_b]),
                f"{at}: kept values differ by up to {max_abs_diff(got, want)}",
            )
            continue
        if not bits_equal(got, want):
            tokens = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten()
            raise AssertionError(
                f"{at}: rows differ at tokens {tokens[:8].tolist()} (max |diff| "
                f"{max_abs_diff(got, want)}); prompt {b.prompt} output {b.output}, drafts "
                f"{ra.drafts_before}, placeholder row {ra.placeholder}, input id {ra.input_id}"
            )
        # The reference, checked on vLLM's own rows, so that the solo checks can trust it.
        ref = divided(penalised(logits[rb.index], b.prompt, rb.counted_output(), extra),
                      b.params.temperature)  # fmt: skip
        check(
            within_division_rounding(ref, want, logits[rb.index], b.params.temperature),
            f"{at}: harness bug: the reference differs from vLLM's built-in row by "
            f"{max_abs_diff(ref, want)}",
        )
        stats["reference_vs_builtin_rows"] += 1
        check(
            bits_equal(got[top], raw[top]),
            f"{at}: token {top} (vocab-1, never seen) changed: {float(raw[top])} -> "
            f"{float(got[top])}; drafts {ra.drafts_before}, placeholder row {ra.placeholder}",
        )
        stats["top_token_rows"] += 1
        bias_only = {"logit_bias": extra.get("logit_bias")}
        unpenalised = divided(penalised(logits[rb.index], [], [], bias_only), b.params.temperature)
        stats["builtin_penalty_changed_rows"] += not bits_equal(want, unpenalised)
        has_penalty = any(
            extra.get(k, d) != d
            for k, d in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
                         ("presence_penalty", 0.0))
        )  # fmt: skip
        stats["twin_placeholder_rows_penalised"] += ra.placeholder and has_penalty


def check_solo(stats, where, s, rows_of, logits, processed, top) -> None:
    """Our windows and scopes against the straightforward per-row reference."""
    for row in rows_of[s.req_id]:
        want = divided(
            penalised(logits[row.index], s.prompt, row.counted_output(), s.tag),
            s.params.temperature,
        )
        got = processed[row.index]
        check(
            within_division_rounding(got, want, logits[row.index], s.params.temperature),
            f"{where} {s.req_id} local {row.local} {s.tag}: differs from the reference by "
            f"{max_abs_diff(got, want)} (token {top}: {float(logits[row.index, top])} -> "
            f"{float(got[top])}, expected {float(want[top])}); prompt {s.prompt} output "
            f"{s.output}, drafts {row.drafts_before}, placeholder row {row.placeholder}",
        )
        stats["solo_rows"] += 1
        stats["solo_window_rows"] += bool(s.tag.get("penalty_last_n"))
        stats["solo_draft_rows"] += row.local > 0 and not row.placeholder
        stats["solo_placeholder_rows"] += row.placeholder


def twin_plan(req: Req, rng: random.Random, num_spec: int, top: int, placeholders: bool) -> Plan:
    """Drafts half from the request's own tokens (so penalties see repeats), half random."""
    if req.prefilling and placeholders:
        return Plan(prefill=req.prefill_len - req.computed, placeholders=num_spec)
    drafts = []
    for _ in range(rng.choice([0, 1, 2, num_spec])):
        pool = req.tokens if rng.random() < 0.5 else None
        drafts.append(rng.choice(pool) if pool else rng.randrange(top))
    return plan_for(req, rng, num_spec, drafts)


@scenario
def builtin_equivalence() -> dict:
    """Our logit_bias / penalties / min_p rows equal vLLM's built-in V2 rows (twin slots),
    windows and scopes equal the reference; speculative rows, placeholders, chunked prefill,
    recycled slots, resumed requests, prefix hits, several calls per step."""
    return run_twins(
        seed=11,
        steps=50,
        num_spec=2,
        capacity=16,
        prompt_range=(1, 40),
    )


@scenario
def penalty_placeholders() -> dict:
    """Every request's first step is its whole prefill plus placeholder draft slots (-1 in
    ``input_ids``): penalised rows must not count token ``vocab - 1`` for them."""
    stats = run_twins(
        seed=5, steps=24, num_spec=3, capacity=8, prompt_range=(2, 12), placeholder_only=True
    )
    return stats


# ---- 2. grammar masks ------------------------------------------------------------------

GRAMMAR_CAPACITY, GRAMMAR_SPEC = 10, 3  # requests and draft tokens of the grammar scenarios


def grammar_runner(seed: int) -> tuple[random.Random, V2Runner, Any]:
    """A seeded rng, a V2 runner at the tiny model's width, and a reference matcher over its
    vocabulary (``tests.test_grammar_bookkeeping.Reference``)."""
    from tests.test_grammar_bookkeeping import WIDTH, Reference

    from constrained.grammars import load_vocab
    from constrained.tiny_model import build_tiny_model

    rng = random.Random(seed)
    draws = own_draws(seed)
    config = harness.make_vllm_config(GRAMMAR_CAPACITY, GRAMMAR_SPEC, 512, 1024)
    check(config.model_config.get_vocab_size() == WIDTH, "the tiny model's width moved")
    runner = V2Runner(
        config,
        max_num_reqs=GRAMMAR_CAPACITY,
        vocab_size=WIDTH,
        num_spec=GRAMMAR_SPEC,
        max_model_len=512,
        max_num_batched_tokens=1024,
    )
    runner.draws = draws
    return rng, runner, Reference(load_vocab(str(build_tiny_model()), WIDTH))


@scenario
def grammar_masks() -> dict:
    """Every constrained row's finite set equals a fresh reference matcher's after the
    request's output fed up to that row (committed, then drafts); plain rows untouched."""
    from tests.test_grammar_bookkeeping import GRAMMAR_CONSTRAINTS, WIDTH, kind_of

    started = time.monotonic()
    rng, runner, reference = grammar_runner(7)
    capacity, num_spec = GRAMMAR_CAPACITY, GRAMMAR_SPEC
    eos = reference.vocab.eos_token_id
    stats = {
        "setup_seconds": round(time.monotonic() - started, 1),
        "slot_reused_by_other_constraint": 0,
        "constrained_rows": 0,
        "checked_array_rows": 0,
        "constrained_draft_rows": 0,
        "constrained_placeholder_rows": 0,
        "constrained_chunk_rows": 0,
        "constrained_resumed_rows": 0,
        "plain_rows": 0,
        "plain_only_steps": 0,
        "finished_by_eos": 0,
        "kinds": [],
    }
    kinds_seen: set[str] = set()
    reqs: list[Req] = []
    parked: list[Req] = []
    last_in_slot: dict[int, dict | None] = {}
    next_id = 0

    def constraint_of(req: Req) -> dict | None:
        return req.params.extra_args or None

    for step_no in range(60):
        plain_only = step_no % 6 == 5  # vLLM skips processing for a batch of plain requests
        for req in list(reqs):
            if req.slot is None:
                continue
            extra = constraint_of(req)
            ended = eos in req.output or len(req.output) >= (40 if extra else 8)
            if ended or rng.random() < 0.05:
                runner.finish(req)
                reqs.remove(req)
                stats["finished_by_eos"] += bool(extra) and eos in req.output
                if not ended and req.output:
                    parked.append(req)  # preempted: back later with its output
        fresh: set[str] = set()
        if not plain_only and parked and runner.num_admitted < capacity and rng.random() < 0.4:
            req = parked.pop(0)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
        for _ in range(0 if plain_only else rng.randint(0, 2)):
            if runner.num_admitted >= capacity:
                break
            next_id += 1
            extra = dict(rng.choice(GRAMMAR_CONSTRAINTS)) if rng.random() < 0.7 else None
            temperature = rng.choice([1.0, 0.7]) if extra else 1.0
            long = rng.random() < 0.25
            prompt = random_tokens(rng, rng.randint(60, 150) if long else rng.randint(3, 12), 1000)
            # A budget never reached: the rows equal the grammar's (closing: budget_closing).
            params = SamplingParams(temperature=temperature, max_tokens=10_000, extra_args=extra)
            req = Req(f"r{next_id}", params, prompt)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
            if extra:
                kinds_seen.add(kind_of(extra))
        plans: dict[str, Plan] = {}
        for req in reqs:
            if plain_only and constraint_of(req):
                continue
            if req.req_id not in fresh and rng.random() > 0.85:
                continue  # live but not scheduled this step
            drafts: list[int] = []
            if not req.prefilling:
                extra = constraint_of(req)
                for _ in range(rng.choice([0, 0, 1, 2, 3])):
                    if extra and rng.random() < 0.7:
                        ok = reference.allowed(extra, req.output + drafts).nonzero().flatten()
                        drafts.append(int(ok[rng.randrange(ok.numel())]))
                    else:
                        drafts.append(rng.randrange(WIDTH))
            plans[req.req_id] = plan_for(req, rng, num_spec, drafts)
        if not plans:
            continue
        step = runner.prepare(plans)
        for req in step.reqs:
            if req.req_id in fresh:
                previous = last_in_slot.get(req.slot, "unused")
                stats["slot_reused_by_other_constraint"] += previous not in (
                    "unused",
                    req.params.extra_args,
                )
                last_in_slot[req.slot] = req.params.extra_args
        logits = torch.randn(step.num_rows, WIDTH, generator=runner.draws)
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        stats["plain_only_steps"] += plain_only
        for row in step.rows:
            req = row.req
            extra = constraint_of(req)
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            if not extra:
                check(bits_equal(processed[row.index], logits[row.index]), f"{at}: plain changed")
                stats["plain_rows"] += 1
                continue
            seen = row.seen_output()
            want = reference.allowed(extra, seen)
            got = torch.isfinite(processed[row.index])
            if not torch.equal(got, want):
                extra_ids = (got & ~want).nonzero().flatten()[:5].tolist()
                missing = (want & ~got).nonzero().flatten()[:5].tolist()
                raise AssertionError(
                    f"{at} {extra}: mask differs from the reference after output {seen} "
                    f"(row input {row.input_id}, placeholder {row.placeholder}, sampled "
                    f"{row.sampled}): {int(got.sum())} allowed vs {int(want.sum())} expected; "
                    f"allowed but not expected {extra_ids}, expected but masked {missing}"
                )
            stats["constrained_rows"] += 1
            stats["checked_array_rows"] += "uniqueItems" in extra.get("json_schema", "")
            stats["constrained_draft_rows"] += row.local > 0 and not row.placeholder
            stats["constrained_placeholder_rows"] += row.placeholder
            stats["constrained_chunk_rows"] += not row.sampled and not row.placeholder
            stats["constrained_resumed_rows"] += req.prefill_len > len(req.prompt)
        runner.commit(step, sample_step(step, processed, rng))
    stats["kinds"] = sorted(kinds_seen)
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 2a'. penalties that spare the structure ------------------------------------------------


@scenario
def penalty_scope() -> dict:
    """With a JSON schema and the repetition family (penalties, DRY or no-repeat-ngram;
    ``penalize_structure`` off, some requests on), the grammar first: a structure row keeps
    the masked logits bit for bit; an open row gets the penalties over the content tokens
    only (committed and drafts before it), or DRY / no-repeat-ngram over the whole text,
    as their references compute them (``tests.test_dry``, ``tests.test_no_repeat_ngram``);
    classes from a reference made from scratch (``tests.test_penalty_scope``); with drafts,
    chunked prefill, preemption, windows and recycled slots."""
    from tests.test_dry import dry_reference
    from tests.test_grammar_bookkeeping import WIDTH, spec_for
    from tests.test_no_repeat_ngram import banned_reference
    from tests.test_penalty_scope import SCHEMA, reference_content

    from constrained.grammars import compile_now
    from constrained.grammars.content import is_whitespace
    from constrained.processors.functional import apply_penalties

    def rstrip_whitespace(tokens: list[int], data: list[bytes]) -> list[int]:
        end = len(tokens)
        while end and is_whitespace(data[tokens[end - 1]]):
            end -= 1
        return tokens[:end]

    rng, runner, reference = grammar_runner(11)
    vocab = reference.vocab
    token_bytes = vocab.token_bytes()
    breakers = {
        t for t in range(WIDTH) if any(c in token_bytes[t] for c in (b"\n", b":", b'"', b"*"))
    }
    compiled: dict = {}
    eos = vocab.eos_token_id
    stats = {"open_rows": 0, "structure_rows": 0, "content_draft_rows": 0, "whole_rows": 0,
             "resumed_rows": 0, "unchecked_rows": 0, "dry_open_rows": 0, "dry_changed_rows": 0,
             "ngram_open_rows": 0, "ngram_banned_rows": 0, "damped_rows": 0}  # fmt: skip
    reqs: list[Req] = []
    parked: list[Req] = []
    next_id = 0

    def options(n: int) -> dict:
        extra: dict = {"json_schema": SCHEMA}
        family = n % 3
        if family == 0:
            extra.update(frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.3)
            if n % 2 == 0:
                extra["penalty_last_n"] = rng.choice([4, 16])
            else:  # whitespace the grammar allows (up to 2 after , and :): damped
                extra.update(whitespace="flexible", max_whitespace=2)
        elif family == 1:
            extra.update(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=1,
                         dry_penalty_last_n=-1)  # fmt: skip
        else:
            extra["no_repeat_ngram_size"] = rng.choice([1, 2])
        if n % 4 == 0:
            extra["penalize_structure"] = True
        return extra

    def make() -> Req:
        nonlocal next_id
        next_id += 1
        params = SamplingParams(temperature=1.0, max_tokens=10_000, extra_args=options(next_id))
        return Req(f"r{next_id}", params, random_tokens(rng, rng.randint(3, 40), 1000))

    for step_no in range(36):
        fresh = turn_over(runner, reqs, parked, rng, max_output=40, drop=0.05, max_new=2,
                          make=make, eos=eos)  # fmt: skip
        plans: dict[str, Plan] = {}
        for req in reqs:
            if req.req_id not in fresh and rng.random() > 0.85:
                continue
            drafts: list[int] = []
            if not req.prefilling:
                for _ in range(rng.choice([0, 0, 1, 2, 3])):
                    extra = req.params.extra_args
                    ok = reference.allowed(extra, req.output + drafts).nonzero().flatten()
                    spaces = [t for t in ok.tolist() if is_whitespace(token_bytes[t])]
                    if spaces and rng.random() < 0.7:  # runs of whitespace, to damp
                        drafts.append(rng.choice(spaces))
                    else:
                        drafts.append(int(ok[rng.randrange(ok.numel())]))
            plans[req.req_id] = plan_for(req, rng, GRAMMAR_SPEC, drafts)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, WIDTH, generator=runner.draws) * 3
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2]))
        for row in step.rows:
            req = row.req
            extra = req.params.extra_args
            got = processed[row.index]
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            if row.placeholder or not row.sampled:
                stats["unchecked_rows"] += 1  # (its sample is discarded)
                continue
            seen = row.seen_output()
            allowed = reference.allowed(extra, seen)
            masked = torch.where(allowed, logits[row.index], float("-inf"))
            if extra.get("penalize_structure"):
                counted, opened = seen, True
                stats["whole_rows"] += 1
            else:
                spec = spec_for({k: v for k, v in extra.items() if "penalt" not in k})
                if spec not in compiled:
                    compiled[spec] = compile_now(spec, vocab)
                counted, opened = reference_content(vocab, compiled[spec], seen)
            if not opened:
                want = masked
                run = len(seen) - len(rstrip_whitespace(seen, token_bytes))
                if run and "frequency_penalty" in extra and not extra.get("penalize_structure"):
                    want = masked.clone()
                    ids = [t for t in range(WIDTH) if is_whitespace(token_bytes[t])]
                    values = want[ids].unsqueeze(0)
                    counts = torch.full_like(values, run, dtype=torch.int64)
                    strength = torch.tensor([[1.3], [1.5], [0.5]])
                    apply_penalties(values, counts, torch.zeros_like(counts), *strength)
                    want[ids] = values[0]
                    stats["damped_rows"] += not bits_equal(want, masked)
                check(bits_equal(got, want), f"{at}: structure row differs (after {seen})")
                stats["structure_rows"] += 1
                continue
            if "dry_multiplier" in extra:
                want = dry_reference(req.prompt + seen, masked, 0.8, 1.75, 1, -1, breakers, 512)
                stats["dry_open_rows"] += 1
                stats["dry_changed_rows"] += not bits_equal(want, masked)
            elif "no_repeat_ngram_size" in extra:
                banned = banned_reference(seen, extra["no_repeat_ngram_size"], None, set())
                want = masked.clone()
                want[sorted(banned)] = float("-inf")
                if not torch.isfinite(want).any():
                    want = masked  # the bans would empty the row: it keeps them
                stats["ngram_open_rows"] += 1
                stats["ngram_banned_rows"] += not bits_equal(want, masked)
            else:
                window = extra.get("penalty_last_n") or 0
                if row.local and window and not extra.get("penalize_structure"):
                    stats["unchecked_rows"] += 1  # drafts do not slide a fed window (documented)
                    continue
                want = penalised(masked, req.prompt, counted, extra)
                stats["open_rows"] += 1
                stats["content_draft_rows"] += row.local > 0 and bool(counted)
            check(
                bits_equal(got, want),
                f"{at}: open row differs from its reference (content {counted}, output "
                f"{seen}, {extra}); differing ids {(got != want).nonzero().flatten()[:8].tolist()}",
            )
            stats["resumed_rows"] += req.prefill_len > len(req.prompt)
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 2b. budget closing ------------------------------------------------------------------


@scenario
def budget_closing() -> dict:
    """Constrained requests with budgets from just enough up: every row allows a subset of
    what the grammar allows, and every request ends with end-of-sequence by ``max_tokens``,
    its output complete; with drafts (accepted only where the processed row allows them),
    placeholders, preemption (resumed with the output so far) and chunked calls."""
    from tests.test_budget_closing import CASES
    from tests.test_grammar_bookkeeping import WIDTH, spec_for

    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.closing import completes, find_witness

    rng, runner, reference = grammar_runner(11)
    capacity, num_spec = GRAMMAR_CAPACITY, GRAMMAR_SPEC
    vocab = reference.vocab
    eos = vocab.eos_token_id

    def spec(extra: dict) -> GrammarSpec:
        return spec_for(extra)

    cases = [{**extra, "grammar_backend": backend} for extra, backend in CASES]
    needs = [len(find_witness(compile_now(spec(c), vocab).matcher(), vocab, 200)) for c in cases]
    stats = {"constrained_rows": 0, "closing_draft_rows": 0, "narrowed_rows": 0,
             "finished": 0, "finished_at_budget": 0, "resumed_closing": 0}  # fmt: skip
    reqs: list[Req] = []
    parked: list[Req] = []
    next_id = 0

    def ended(req: Req) -> bool:
        return eos in req.output or len(req.output) >= req.params.max_tokens

    for step_no in range(220):
        for req in list(reqs):
            if req.slot is None:
                continue
            if ended(req):
                runner.finish(req)
                reqs.remove(req)
                output = req.output[: req.params.max_tokens]
                check(
                    eos in output,
                    f"{req.req_id} {req.params.extra_args} cut at max_tokens: {req.output}",
                )
                body = output[: output.index(eos)]
                extra = req.params.extra_args
                matcher = compile_now(spec(extra), vocab).matcher()
                check(completes(matcher, body), f"{req.req_id} {extra}: incomplete {body}")
                stats["finished"] += 1
                stats["finished_at_budget"] += len(output) == req.params.max_tokens
            elif req.output and rng.random() < 0.06:
                runner.finish(req)
                reqs.remove(req)
                parked.append(req)  # preempted: back later with its output
        fresh: set[str] = set()
        if parked and runner.num_admitted < capacity and rng.random() < 0.4:
            req = parked.pop(0)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
            left = req.params.max_tokens - len(req.output)
            stats["resumed_closing"] += left <= 12
        for _ in range(rng.randint(0, 2)):
            if runner.num_admitted >= capacity:
                break
            next_id += 1
            which = rng.randrange(len(cases))
            budget = needs[which] + 1 + rng.randint(0, 14)
            params = SamplingParams(temperature=1.0, max_tokens=budget, extra_args=cases[which])
            prompt = random_tokens(rng, rng.randint(3, 40), 1000)
            req = Req(f"r{next_id}", params, prompt)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
        plans: dict[str, Plan] = {}
        for req in reqs:
            if req.req_id not in fresh and rng.random() > 0.85:
                continue
            drafts: list[int] = []
            if not req.prefilling:
                for _ in range(rng.choice([0, 1, 2, 3])):
                    ok = reference.allowed(req.params.extra_args, req.output + drafts)
                    ok = ok.nonzero().flatten()
                    drafts.append(int(ok[rng.randrange(ok.numel())]))
            plans[req.req_id] = plan_for(req, rng, num_spec, drafts)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, WIDTH, generator=runner.draws)
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        for row in step.rows:
            req = row.req
            seen = row.seen_output()
            allowed = reference.allowed(req.params.extra_args, seen)
            got = torch.isfinite(processed[row.index])
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            check(bool(got.any()), f"{at}: every token masked")
            if eos in seen:
                continue  # after an accepted end-of-sequence draft: vLLM stops there
            extra_ids = (got & ~allowed).nonzero().flatten()[:5].tolist()
            check(not extra_ids, f"{at} {req.params.extra_args}: allows {extra_ids} after {seen}")
            left = req.params.max_tokens - len(seen)
            stats["constrained_rows"] += 1
            stats["narrowed_rows"] += int(got.sum()) < int(allowed.sum())
            stats["closing_draft_rows"] += row.local > 0 and not row.placeholder and left <= 12
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


@scenario
def reasoning() -> dict:
    """Requests that think first (``reasoning_end``, ``max_reasoning_tokens``, prompts that
    already closed thinking, budgets that force the marker): a thinking row is the logits as
    they were but end-of-sequence, or one forced marker token; after the marker every row is a
    subset of the grammar's; every request ends complete; with drafts, placeholders,
    preemption (resumed with the output so far) and chunked calls."""
    from tests.test_grammar_bookkeeping import WIDTH
    from tests.test_reasoning_gate import MARKER, SCHEMA, spilling_tokens, spills_after, split

    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.closing import completes
    from constrained.grammars.marker import marker_for, text_pieces

    rng, runner, reference = grammar_runner(21)
    capacity, num_spec = GRAMMAR_CAPACITY, GRAMMAR_SPEC
    vocab = reference.vocab
    eos = vocab.eos_token_id
    marker = marker_for(vocab, MARKER).ids
    newline = vocab.hf_tokenizer.encode("\n\n", add_special_tokens=False)
    grammar = GrammarSpec("json_schema", SCHEMA)
    pieces = text_pieces(vocab)
    spilling = spilling_tokens(pieces)
    writes_marker = {t for ids in marker_for(vocab, MARKER).rest for t in ids}
    stats = {"thinking_rows": 0, "forced_rows": 0, "constrained_rows": 0, "finished": 0,
             "closed_prompts": 0, "thinking_draft_rows": 0, "resumed_thinking": 0,
             "spill_rows": 0, "stop_rows": 0}  # fmt: skip
    reqs: list[Req] = []
    parked: list[Req] = []
    next_id = 0

    def answer(req: Req, seen: list[int]) -> list[int] | None:
        if split(req.prompt, vocab) is not None:
            return seen
        parts = split(seen, vocab)
        return parts[1] if parts is not None else None

    for step_no in range(140):  # 200 before, for CI time: every count still >= 1.5x its minimum
        for req in list(reqs):
            if req.slot is None:
                continue
            output = req.output[: req.params.max_tokens]
            if eos in output or len(output) >= req.params.max_tokens:
                runner.finish(req)
                reqs.remove(req)
                check(
                    eos in output,
                    f"{req.req_id} {req.params.extra_args} cut at max_tokens: {req.output}",
                )
                body = answer(req, output[: output.index(eos)])
                check(body is not None, f"{req.req_id} ended without the marker")
                check(completes(compile_now(grammar, vocab).matcher(), body), f"{req.req_id}")
                stats["finished"] += 1
                stats["closed_prompts"] += split(req.prompt, vocab) is not None
            elif req.output and rng.random() < 0.05:
                runner.finish(req)
                reqs.remove(req)
                parked.append(req)  # preempted: back later with its output
        fresh: set[str] = set()
        if parked and runner.num_admitted < capacity and rng.random() < 0.4:
            req = parked.pop(0)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
            stats["resumed_thinking"] += answer(req, req.output) is None
        for _ in range(rng.randint(0, 2)):
            if runner.num_admitted >= capacity:
                break
            next_id += 1
            extra = {"json_schema": SCHEMA, "reasoning_end": MARKER}
            think = rng.choice([None, 0, 3, 8])
            if think is not None:
                extra["max_reasoning_tokens"] = think
            closed = rng.random() < 0.2
            prompt = random_tokens(rng, rng.randint(3, 40), 1000)
            prompt += (list(marker) + newline) * closed
            stop = [rng.randrange(1000)] if rng.random() < 0.3 else None  # banned while thinking
            params = SamplingParams(
                temperature=1.0,
                max_tokens=rng.choice([10_000, 60]),
                stop_token_ids=stop,
                extra_args=extra,
            )
            req = Req(f"r{next_id}", params, prompt)
            reqs.append(req)
            admit_fresh(runner, req, rng)
            fresh.add(req.req_id)
        plans: dict[str, Plan] = {}
        for req in reqs:
            if req.req_id not in fresh and rng.random() > 0.85:
                continue
            drafts: list[int] = []
            if not req.prefilling:
                for _ in range(rng.choice([0, 1, 2, 3])):
                    body = answer(req, req.output + drafts)
                    if body is None:  # thinking: any token, the marker's pieces often
                        drafts.append(rng.choice([*marker, rng.randrange(1000)]))
                        continue
                    ok = reference.allowed({"json_schema": SCHEMA}, body).nonzero().flatten()
                    drafts.append(int(ok[rng.randrange(ok.numel())]))
            plans[req.req_id] = plan_for(req, rng, num_spec, drafts)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, WIDTH, generator=runner.draws)
        logits[:, marker[0]] += 6.0 * (torch.rand(step.num_rows, generator=runner.draws) < 0.2)
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        for row in step.rows:
            req = row.req
            seen = row.seen_output()
            got = torch.isfinite(processed[row.index])
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            check(bool(got.any()), f"{at}: every token masked")
            if eos in seen or row.placeholder or not row.sampled:
                continue  # a chunked-prefill row: its sample is discarded
            body = answer(req, seen)
            if body is None:
                if int(got.sum()) == 1:
                    check(int(got.nonzero()[0]) in marker, f"{at}: forced a non-marker token")
                    stats["forced_rows"] += 1
                else:
                    spills = spills_after(seen, pieces, spilling)
                    stops = set(req.params.stop_token_ids) - writes_marker  # it stays writable
                    expected = {eos, *stops, *spills}
                    banned = set((~got).nonzero().flatten().tolist())
                    check(banned == expected, f"{at}: thinking bans {banned ^ expected}")
                    stats["thinking_rows"] += 1
                    stats["spill_rows"] += bool(spills)
                    stats["stop_rows"] += bool(req.params.stop_token_ids)
                    stats["thinking_draft_rows"] += row.local > 0
                continue
            allowed = reference.allowed({"json_schema": SCHEMA}, body)
            extra_ids = (got & ~allowed).nonzero().flatten()[:5].tolist()
            check(not extra_ids, f"{at}: allows {extra_ids} after {body}")
            stats["constrained_rows"] += 1
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 3. truncation samplers (top-n-sigma, typical-p, XTC) --------------------------------


@scenario
def truncation_samplers() -> dict:
    """Every row of a request using top-n-sigma / typical-p / XTC keeps exactly the reference's
    tokens (tokens at a float boundary aside), with its values then divided by temperature;
    XTC's draw keyed on the row's position; plain and greedy rows untouched. Drafts,
    placeholders, chunked prefill, resumed requests, recycled slots, several calls per step."""
    from tests.test_truncation_samplers import random_params, reference, request_seed

    from constrained.processors.xtc import XtcProcessor

    import os

    from constrained.settings import reset

    # The Triton kernels (off by default under the interpreter; this vocabulary is small).
    os.environ["CONSTRAINED_TRUNCATION_KERNELS"] = "1"
    reset()
    rng = random.Random(3)
    draws = own_draws(3)
    capacity, num_spec, vocab = 10, 2, 2048
    started = time.monotonic()
    config = harness.make_vllm_config(capacity, num_spec, 256, 512)
    runner = V2Runner(
        config,
        max_num_reqs=capacity,
        vocab_size=vocab,
        num_spec=num_spec,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    xtc = next(p for p in runner.custom if isinstance(p, XtcProcessor) and not inert(p))
    stats = {
        "setup_seconds": round(time.monotonic() - started, 1),
        "sampler_rows": 0,
        "sampler_draft_rows": 0,
        "sampler_placeholder_rows": 0,
        "sampler_resumed_rows": 0,
        "rows_truncated": 0,
        "xtc_rows_applied": 0,
        "plain_rows": 0,
    }
    reqs: list[Req] = []
    parked: list[Req] = []
    ids = iter(range(1, 1 << 30))

    def make() -> Req:
        name = f"t{next(ids)}"
        params = random_params(rng) if rng.random() < 0.8 else SamplingParams(temperature=1.0)
        return Req(name, params, random_tokens(rng, rng.randint(2, 30), vocab))

    for step_no in range(42):  # 50 before, for CI time: every count still >= 1.4x its minimum
        fresh = turn_over(runner, reqs, parked, rng, max_output=20, drop=0.06, max_new=3, make=make)
        plans = decode_plans(
            reqs,
            fresh,
            rng,
            num_spec,
            lambda req: random_tokens(rng, rng.choice([0, 1, num_spec]), vocab),
        )
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, vocab, generator=draws) * rng.choice([0.5, 2.0, 4.0])
        for r in range(step.num_rows):
            logits[r, torch.randint(vocab, (rng.randint(0, 4),), generator=draws)] += 6.0
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        for row in step.rows:
            req, raw = row.req, logits[row.index]
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            extra = req.params.extra_args
            if not extra:
                check(bits_equal(processed[row.index], raw), f"{at}: plain row changed")
                stats["plain_rows"] += 1
                continue
            seed = request_seed(req.params, xtc, req.slot)
            expected, near = reference(raw, req.params, seed, row.pos + 1)
            got = processed[row.index]
            differ = torch.isfinite(got) != torch.isfinite(expected)
            check(
                not bool((differ & ~near).any()),
                f"{at} {extra}: kept set differs from the reference at "
                f"{(differ & ~near).nonzero().flatten()[:5].tolist()}",
            )
            kept = torch.isfinite(got)
            check(bool(kept.any()), f"{at}: nothing left to sample")
            want = divided(raw, req.params.temperature)
            check(bits_equal(got[kept], want[kept]), f"{at}: kept values changed")
            stats["sampler_rows"] += 1
            stats["sampler_draft_rows"] += row.local > 0 and not row.placeholder
            stats["sampler_placeholder_rows"] += row.placeholder
            stats["sampler_resumed_rows"] += req.prefill_len > len(req.prompt)
            stats["rows_truncated"] += bool((~kept).any())
            stats["xtc_rows_applied"] += bool(
                extra.get("xtc_probability")
                and req.params.temperature > 0
                and (torch.isfinite(expected) != torch.isfinite(raw)).any()
                and "top_n_sigma" not in extra
                and "typical_p" not in extra
            )
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 4. no-repeat-ngram ------------------------------------------------------------------


@scenario
def ngram_sampler() -> dict:
    """Every row of a request with ``no_repeat_ngram_size`` bans exactly the reference's tokens
    for the output it sees (committed tokens, then the drafts before it; -1 placeholders are
    no tokens); plain rows untouched. Small vocabulary, drafts drawn from the request's own
    tokens, so n-grams repeat."""
    from tests.test_no_repeat_ngram import banned_reference

    from constrained.processors.no_repeat_ngram import NoRepeatNGramProcessor

    import os

    from constrained.settings import reset

    # The Triton kernel (off by default under the interpreter; this vocabulary is small).
    os.environ["CONSTRAINED_TRUNCATION_KERNELS"] = "1"
    reset()
    rng = random.Random(9)
    draws = own_draws(9)
    capacity, num_spec, vocab = 10, 3, 64
    started = time.monotonic()
    config = harness.make_vllm_config(capacity, num_spec, 256, 512)
    runner = V2Runner(
        config,
        max_num_reqs=capacity,
        vocab_size=vocab,
        num_spec=num_spec,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    ngram = next(p for p in runner.custom if isinstance(p, NoRepeatNGramProcessor) and not inert(p))
    check(ngram.on_triton, "the no-repeat-ngram kernel is off")
    stats = {
        "setup_seconds": round(time.monotonic() - started, 1),
        "ngram_rows": 0,
        "ngram_rows_banning": 0,
        "ngram_draft_rows_banning": 0,
        "ngram_placeholder_rows": 0,
        "ngram_resumed_rows": 0,
        "plain_rows": 0,
    }
    reqs: list[Req] = []
    parked: list[Req] = []
    ids = iter(range(1, 1 << 30))

    def make() -> Req:
        name = f"g{next(ids)}"
        extra: dict | None = None
        if rng.random() < 0.8:
            extra = {"no_repeat_ngram_size": rng.choice([1, 2, 3, 4])}
            if rng.random() < 0.5:
                extra["ngram_window"] = rng.choice([2, 6, 16])
            if rng.random() < 0.3:
                extra["ngram_whitelist"] = rng.sample(range(vocab), 3)
        params = SamplingParams(temperature=rng.choice([0.0, 1.0]), extra_args=extra)
        return Req(name, params, random_tokens(rng, rng.randint(2, 20), vocab))

    def drafts_for(req: Req) -> list[int]:  # from the request's own tokens: repeats
        pool = req.output[-6:] or req.prompt
        return [rng.choice(pool) for _ in range(rng.choice([0, 1, 2, num_spec]))]

    for step_no in range(50):
        fresh = turn_over(runner, reqs, parked, rng, max_output=40, drop=0.05, max_new=2, make=make)
        plans = decode_plans(reqs, fresh, rng, num_spec, drafts_for)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, vocab, generator=draws)
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        for row in step.rows:
            req, raw = row.req, logits[row.index]
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            extra = req.params.extra_args
            got = processed[row.index]
            if not extra:
                check(bits_equal(got, raw), f"{at}: plain row changed")
                stats["plain_rows"] += 1
                continue
            seen = row.seen_output()
            if row.placeholder:  # -1 placeholder drafts: positions holding no token
                first = row.pos - row.local
                seen = req.tokens[len(req.prompt) : first + 1] + [-1] * row.local
            want = banned_reference(
                seen,
                extra["no_repeat_ngram_size"],
                extra.get("ngram_window"),
                set(extra.get("ngram_whitelist") or ()),
            )
            want = {t for t in want if t >= 0}  # a placeholder matches nothing
            masked = set((~torch.isfinite(got)).nonzero().flatten().tolist())
            check(masked == want, f"{at} {extra}: banned {sorted(masked)}, expected "
                  f"{sorted(want)} after output {seen}")  # fmt: skip
            kept = torch.isfinite(got)
            check(
                bits_equal(got[kept], divided(raw, req.params.temperature)[kept]),
                f"{at}: kept values changed",
            )
            stats["ngram_rows"] += 1
            stats["ngram_rows_banning"] += bool(want)
            stats["ngram_draft_rows_banning"] += bool(want) and row.local > 0
            stats["ngram_placeholder_rows"] += row.placeholder
            stats["ngram_resumed_rows"] += req.prefill_len > len(req.prompt)
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 5. DRY -------------------------------------------------------------------------------


@scenario
def dry_sampler() -> dict:
    """Every row of a request with DRY equals the llama.cpp port's row for the tokens it sees
    (prompt, committed output, then the drafts before it; a -1 placeholder is a token that
    matches nothing), with the tiny model's real tokenizer for the breakers; plain rows
    untouched. Small vocabulary and repetitive prompts and drafts, so repeats are long."""
    from tests.test_dry import dry_reference

    from constrained.processors.dry import DryProcessor

    rng = random.Random(13)
    draws = own_draws(13)
    capacity, num_spec, vocab = 10, 3, 48
    started = time.monotonic()
    config = harness.make_vllm_config(capacity, num_spec, 256, 512)
    runner = V2Runner(
        config,
        max_num_reqs=capacity,
        vocab_size=vocab,
        num_spec=num_spec,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    dry = next(p for p in runner.custom if isinstance(p, DryProcessor) and not inert(p))
    token_bytes = dry.breakers.token_bytes()  # the real tokenizer: ids 0-47 are ASCII
    stats = {
        "setup_seconds": round(time.monotonic() - started, 1),
        "dry_rows": 0,
        "dry_rows_penalized": 0,
        "dry_draft_rows_penalized": 0,
        "dry_placeholder_rows": 0,
        "dry_resumed_rows": 0,
        "dry_breaker_rows": 0,
        "plain_rows": 0,
    }
    reqs: list[Req] = []
    parked: list[Req] = []
    ids = iter(range(1, 1 << 30))

    def make() -> Req:
        name = f"d{next(ids)}"
        extra: dict | None = None
        if rng.random() < 0.8:
            extra = {
                "dry_multiplier": rng.choice([0.8, 2.0]),
                "dry_base": rng.choice([1.1, 1.75, 3.0]),
                "dry_allowed_length": rng.choice([1, 2, 3]),
                "dry_penalty_last_n": rng.choice([-1, 8, 32]),
            }
            if rng.random() < 0.4:
                extra["dry_sequence_breakers"] = rng.choice([["#"], ["%", "&"], []])
        params = SamplingParams(temperature=rng.choice([0.0, 1.0]), extra_args=extra)
        prompt = random_tokens(rng, rng.randint(2, 6), vocab) * rng.randint(1, 4)
        return Req(name, params, prompt)

    def drafts_for(req: Req) -> list[int]:  # from the request's own tokens: repeats
        pool = req.tokens[-5:]
        return [rng.choice(pool) for _ in range(rng.choice([0, 1, 2, num_spec]))]

    for step_no in range(45):
        fresh = turn_over(runner, reqs, parked, rng, max_output=30, drop=0.05, max_new=2, make=make)
        plans = decode_plans(reqs, fresh, rng, num_spec, drafts_for)
        if not plans:
            continue
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, vocab, generator=draws) * 3
        processed = runner.process(step, logits.clone(), rng.choice([None, None, 2, 4]))
        for row in step.rows:
            req, raw = row.req, logits[row.index]
            at = f"step {step_no} row {row.index} {req.req_id} local {row.local}"
            extra = req.params.extra_args
            got = processed[row.index]
            if not extra:
                check(bits_equal(got, raw), f"{at}: plain row changed")
                stats["plain_rows"] += 1
                continue
            first = row.pos - row.local
            if row.placeholder:
                seen = req.tokens[: first + 1] + [-1] * row.local
            else:
                seen = req.tokens[: first + 1] + row.drafts_before
            names = extra.get("dry_sequence_breakers", ["\n", ":", '"', "*"])
            breakers = {t for t in range(vocab) if any(n.encode() in token_bytes[t] for n in names)}
            want = dry_reference(
                seen,
                raw,
                extra["dry_multiplier"],
                extra["dry_base"],
                extra["dry_allowed_length"],
                extra["dry_penalty_last_n"],
                breakers | {-1} if row.placeholder else breakers,
                256,
            )
            want = divided(want, req.params.temperature)
            check(bits_equal(got, want), f"{at} {extra}: differs from llama.cpp's DRY after "
                  f"{seen}: max diff {max_abs_diff(got, want)}")  # fmt: skip
            stats["dry_rows"] += 1
            changed = not bits_equal(want, divided(raw, req.params.temperature))
            stats["dry_rows_penalized"] += changed
            stats["dry_draft_rows_penalized"] += changed and row.local > 0
            stats["dry_placeholder_rows"] += row.placeholder
            stats["dry_resumed_rows"] += req.prefill_len > len(req.prompt)
            stats["dry_breaker_rows"] += any(t in breakers for t in seen)
        runner.commit(step, sample_step(step, processed, rng))
    stats.update(vars(runner.counters))
    stats.update(runner.sync_guard.counts())
    return stats


# ---- 7. tensor-parallel ranks ------------------------------------------------------------


@scenario
def tensor_parallel_ranks() -> dict:
    """Two ranks' processors agree bit for bit: under tensor parallelism every rank builds its
    own processors and samples the same all-gathered logits, so two V2 samplers (two sets of
    our processors, built one after the other in one process, as two ranks would build
    theirs) driven through the same steps must hand on identical logits at every row of every
    step. Catches any state shared between instances or keyed on anything but the requests
    (XTC's unseeded counter, compile caches, worker threads). Every option kind mixed, at the
    tiny model's width; drafts, placeholders, chunked prefill, preemption, chunked calls."""
    from tests.test_grammar_bookkeeping import CONSTRAINTS, WIDTH
    from tests.test_truncation_samplers import random_params

    capacity, num_spec = 8, 2
    started = time.monotonic()

    def options(rng: random.Random) -> SamplingParams:
        params = random_params(rng)  # top-n-sigma / typical-p / XTC, seeded or not
        extra = dict(params.extra_args or {})
        if rng.random() < 0.3:
            extra.update(rng.choice(CONSTRAINTS))
        if rng.random() < 0.4:
            extra.update(solo_options(rng, WIDTH))
        if rng.random() < 0.3:
            extra["dry_multiplier"] = 0.8
        if rng.random() < 0.3:
            extra["no_repeat_ngram_size"] = rng.choice([1, 2, 3])
        if rng.random() < 0.3:
            extra["min_p"] = 0.1
        if rng.random() < 0.15:
            extra = {}
        return SamplingParams(temperature=params.temperature, seed=params.seed,
                              extra_args=extra or None)  # fmt: skip

    def one_rank() -> tuple[list[torch.Tensor], dict]:
        rng = random.Random(21)
        draws = own_draws(21)
        config = harness.make_vllm_config(capacity, num_spec, 256, 512)
        runner = V2Runner(
            config,
            max_num_reqs=capacity,
            vocab_size=WIDTH,
            num_spec=num_spec,
            max_model_len=256,
            max_num_batched_tokens=512,
        )
        seen = {"rows": 0, "unseeded_xtc_rows": 0, "constrained_rows": 0, "plain_rows": 0}
        reqs: list[Req] = []
        parked: list[Req] = []
        ids = iter(range(1, 1 << 30))
        processed_steps, traces = [], []
        runner.sync_guard.trace = []

        def make() -> Req:
            return Req(f"r{next(ids)}", options(rng), random_tokens(rng, rng.randint(2, 20), 5000))

        for _ in range(36):
            fresh = turn_over(runner, reqs, parked, rng, max_output=14, drop=0.06, max_new=3,
                              make=make)  # fmt: skip

            def drafts(req: Req) -> list[int]:
                return random_tokens(rng, rng.choice([0, num_spec]), 5000)

            plans = decode_plans(reqs, fresh, rng, num_spec, drafts)
            if not plans:
                continue
            step = runner.prepare(plans)
            logits = torch.randn(step.num_rows, WIDTH, generator=draws) * 3.0
            runner.sync_guard.trace.clear()
            processed = runner.process(step, logits.clone(), rng.choice([None, None, 3]))
            processed_steps.append(processed.clone())
            traces.append(
                (row_hashes(logits), list(runner.sync_guard.trace), [r.req for r in step.rows])
            )
            for row in step.rows:
                extra = row.req.params.extra_args or {}
                seen["rows"] += 1
                seen["plain_rows"] += not extra
                seen["constrained_rows"] += bool(extra.keys() & {"regex", "json_schema", "grammar"})
                seen["unseeded_xtc_rows"] += bool(extra.get("xtc_probability")) and (
                    row.req.params.seed is None)  # fmt: skip
            runner.commit(step, sample_step(step, processed, rng))
        runner.sync_guard.trace = None
        seen.update(vars(runner.counters))
        seen.update(runner.sync_guard.counts())
        return processed_steps, traces, seen

    first, first_traces, stats = one_rank()
    second, second_traces, _ = one_rank()
    check(len(first) == len(second), f"ranks ran {len(first)} and {len(second)} steps")
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        rows = (a != b) & ~(a.isnan() & b.isnan())
        where = rows.any(dim=1).nonzero().flatten().tolist()
        if where:
            why = rank_difference(first_traces[i], second_traces[i], where[0], a, b)
            check(False, f"step {i}: ranks differ in rows {where}; {why}")
    stats["compared_steps"] = len(first)
    stats["setup_seconds"] = round(time.monotonic() - started, 1)
    return stats


def rank_difference(first: tuple, second: tuple, row: int, a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two ranks' row first parted: the input, or the first processor whose output
    differs (from ``SyncGuard.trace``), with the row's options and a few differing entries."""
    (inputs_a, trace_a, reqs), (inputs_b, trace_b, _) = first, second
    req = reqs[row]
    where = "the input logits" if inputs_a[row] != inputs_b[row] else "no processor"
    for k, ((name, hashes_a), (name_b, hashes_b)) in enumerate(zip(trace_a, trace_b, strict=False)):
        if where == "no processor" and (name != name_b or hashes_a[row] != hashes_b[row]):
            where = f"{name} (after {[n for n, _ in trace_a[:k]]})"
    ids = ((a[row] != b[row]) & ~(a[row].isnan() & b[row].isnan())).nonzero().flatten()
    samples = [(int(t), float(a[row, t]), float(b[row, t])) for t in ids[:6]]
    return (
        f"first differs after {where}; request {req.req_id} seed {req.params.seed} "
        f"temperature {req.params.temperature} {req.params.extra_args}; {ids.numel()} entries "
        f"differ, e.g. (id, first, second) {samples}; -inf: {int(a[row].isinf().sum())} vs "
        f"{int(b[row].isinf().sum())}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SCENARIOS:
        print(f"usage: python -m tests.v2_real.scenarios {{{','.join(SCENARIOS)}}}")
        return 2
    harness.check_vllm_internals()
    start = time.monotonic()
    counts = SCENARIOS[argv[0]]()
    counts["seconds"] = round(time.monotonic() - start, 1)
    counts = {
        k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v)
        for k, v in counts.items()
    }
    harness.emit(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
