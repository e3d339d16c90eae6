"""Our processors on vLLM's real Model Runner V2 sampler, on CPU: one subprocess per scenario.

Real vLLM code (``tests/v2_real/harness.py``): ``RequestState``, vLLM's loader building our
processors, the ``Sampler`` with its built-in logit-bias / penalties / temperature / min-p
stages and ``apply_sampling_params``, the runner's input kernels, the rejection sampler's
``gather_draft_sampled`` and request chunking, ``post_update``. Its Triton kernels run in
Triton's interpreter. Simulated: the scheduler, the model (random logits), the drafter and the
accept/sample decision.

The harness patches Triton and torch globally, so each scenario runs in its own process
(``python -m tests.v2_real.scenarios NAME``, two at a time); this file never imports it. A
scenario exits non-zero with a message on the first mismatch, and prints one ``V2REAL {json}``
line of counts that must reach the minimums below, so that nothing passes vacuously. Never
skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # beside the engine worker under `make test`, on a loaded host

# Each minimum is about half of what the seeded scenario produces today (two thirds for
# ``truncation_samplers`` and ``reasoning``, whose step counts were cut for CI time).
MINIMUMS: dict[str, dict[str, int]] = {
    "builtin_equivalence": {
        "twin_rows": 200,
        "twin_rows_processed": 200,  # vLLM's own rows did change
        "twin_draft_rows": 60,
        "twin_placeholder_rows": 8,
        "twin_min_p_rows": 80,
        "twin_t07_rows": 80,
        "reference_vs_builtin_rows": 80,  # the reference itself equals vLLM's rows
        "builtin_penalty_changed_rows": 60,  # and vLLM's penalties did change them
        "top_token_rows": 80,
        "solo_rows": 150,
        "solo_window_rows": 100,
        "solo_draft_rows": 40,
        "solo_placeholder_rows": 4,
        "plain_rows": 50,
        "chunked_prefill_rows": 20,
        "multi_call_steps": 8,
        "skipped_calls": 5,
        "resumed": 8,
        "recycled_slots": 30,
        "prefix_hits": 5,
        "multi_token_commits": 50,
    },
    "penalty_placeholders": {
        "twin_placeholder_rows": 20,
        "twin_placeholder_rows_penalised": 10,
        "solo_placeholder_rows": 12,
        "top_token_rows": 40,
        "placeholder_rows": 60,
        "draft_rows": 60,
        "recycled_slots": 15,
    },
    "grammar_masks": {
        "constrained_rows": 100,
        "checked_array_rows": 20,  # uniqueItems / contains (checked_matcher.py)
        "constrained_draft_rows": 30,
        "constrained_placeholder_rows": 15,
        "constrained_chunk_rows": 5,
        "constrained_resumed_rows": 8,
        "plain_rows": 80,
        "plain_only_steps": 3,
        "skipped_steps": 3,
        "multi_call_steps": 6,
        "finished_by_eos": 10,
        "slot_reused_by_other_constraint": 5,
        "recycled_slots": 20,
        "prefix_hits": 8,
        "multi_token_commits": 15,
    },
    "budget_closing": {
        "constrained_rows": 1800,
        # (765 before every grammar kept its near rows' checks, 679 since, 2026-11-29: the
        # outputs, and so the rows, differ; every request still ends complete by its budget)
        "narrowed_rows": 600,
        "closing_draft_rows": 140,
        "finished": 22,
        "finished_at_budget": 4,
        "resumed_closing": 5,
        "multi_call_steps": 40,
        "recycled_slots": 70,
    },
    "reasoning": {
        "thinking_rows": 200,
        "forced_rows": 30,
        "constrained_rows": 300,
        "finished": 15,
        "closed_prompts": 2,
        "thinking_draft_rows": 40,
        "resumed_thinking": 2,
        "spill_rows": 3,
        "stop_rows": 20,
        "multi_call_steps": 20,
    },
    "truncation_samplers": {
        "sampler_rows": 280,
        "sampler_draft_rows": 120,
        "sampler_placeholder_rows": 12,
        "sampler_resumed_rows": 60,
        "rows_truncated": 190,
        "xtc_rows_applied": 5,
        "plain_rows": 120,
        "multi_call_steps": 9,
        "recycled_slots": 20,
        "resumed": 8,
    },
    "penalty_scope": {
        "open_rows": 15,
        "structure_rows": 150,
        "content_draft_rows": 3,
        "whole_rows": 50,
        "dry_open_rows": 30,
        "ngram_open_rows": 25,
        "ngram_banned_rows": 5,
        "damped_rows": 2,
        "resumed_rows": 8,
        "multi_call_steps": 5,
        "recycled_slots": 8,
    },
    "dry_sampler": {
        "dry_rows": 400,
        "dry_rows_penalized": 80,
        "dry_draft_rows_penalized": 60,
        "dry_placeholder_rows": 20,
        "dry_resumed_rows": 50,
        "dry_breaker_rows": 150,
        "plain_rows": 25,
        "multi_call_steps": 10,
        "recycled_slots": 15,
        "resumed": 5,
    },
    "tensor_parallel_ranks": {
        "compared_steps": 30,
        "rows": 350,
        "constrained_rows": 80,
        "unseeded_xtc_rows": 30,
        "plain_rows": 30,
        "draft_rows": 120,
        "placeholder_rows": 15,
        "multi_call_steps": 5,
        "recycled_slots": 15,
        "resumed": 3,
    },
    "ngram_sampler": {
        "ngram_rows": 380,
        "ngram_rows_banning": 120,
        "ngram_draft_rows_banning": 100,
        "ngram_placeholder_rows": 20,
        "ngram_resumed_rows": 150,
        "plain_rows": 30,
        "multi_call_steps": 7,
        "recycled_slots": 14,
        "resumed": 9,
    },
}


# Longest first (CI machine, 2026-12-03: 119 s down to 34 s alone), two processes at a time:
# Triton's interpreter keeps one core busy, and CI has two (about 6 minutes saved).
LONGEST_FIRST = (
    "budget_closing", "tensor_parallel_ranks", "truncation_samplers", "penalty_scope",
    "builtin_equivalence", "reasoning", "dry_sampler", "grammar_masks", "ngram_sampler",
    "penalty_placeholders",
)  # fmt: skip
AT_ONCE = 2


def run_process(name: str) -> subprocess.CompletedProcess | subprocess.TimeoutExpired:
    """Scenario ``name`` in its own process: what it printed, or the timeout it hit."""
    env = dict(os.environ)
    for key, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("VLLM_CPU_KVCACHE_SPACE", "2"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ):
        env.setdefault(key, value)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tests.v2_real.scenarios", name],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        return exc


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest) -> Iterator[dict[str, Future]]:
    """The selected tests' scenarios, started at the module's first test, ``AT_ONCE`` at a
    time."""
    assert set(LONGEST_FIRST) == set(MINIMUMS)
    selected = {item.name for item in request.session.items if item.module is request.module}
    pool = ThreadPoolExecutor(max_workers=AT_ONCE, thread_name_prefix="v2-scenario")
    yield {
        name: pool.submit(run_process, name) for name in LONGEST_FIRST if f"test_{name}" in selected
    }
    pool.shutdown(wait=True, cancel_futures=True)


def run_scenario(name: str, started: dict[str, Future]) -> dict:
    proc = started[name].result()
    if isinstance(proc, subprocess.TimeoutExpired):
        tail = (proc.stderr or b"")[-4000:]
        pytest.fail(f"scenario {name} ran past {TIMEOUT_S} s; stderr tail:\n{tail!r}")
    if proc.returncode != 0:
        pytest.fail(
            f"scenario {name} exited {proc.returncode}; stderr tail:\n{proc.stderr[-6000:]}"
            f"\nstdout tail:\n{proc.stdout[-2000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("V2REAL ")]
    assert len(lines) == 1, f"scenario {name}: no counts line; stdout:\n{proc.stdout[-2000:]}"
    return json.loads(lines[0].removeprefix("V2REAL "))


def check_counts(name: str, started: dict[str, Future]) -> dict:
    counts = run_scenario(name, started)
    short = {k: (counts.get(k), want) for k, want in MINIMUMS[name].items()
             if not counts.get(k, 0) >= want}  # fmt: skip
    assert not short, f"scenario {name} covered too little (got, minimum): {short}; {counts}"
    # Every apply of ours ran under the sync guard (``v2_real/sync_guard.py``): no host read
    # of a device tensor but the grammar mask's one fetch, at most once per apply call.
    assert counts["guarded_apply_calls"] >= 100, counts
    assert counts["max_fetches_per_apply"] <= 1, counts
    return counts


def test_builtin_equivalence(scenarios: dict[str, Future]) -> None:
    """``logit_bias``, penalties and ``min_p`` via ``extra_args`` give exactly vLLM's built-in V2
    rows (twin slots, T = 1 and 0.7), windows and scopes give the reference's rows; with
    draft rows, placeholder rows, chunked prefill, resumed requests, prefix hits, recycled
    slots and chunked ``apply_sampling_params`` calls. Our processors' memory does not grow
    after construction (vLLM sizes the KV cache from a start-up profile)."""
    check_counts("builtin_equivalence", scenarios)


def test_grammar_masks(scenarios: dict[str, Future]) -> None:
    """Every constrained row's allowed set equals a fresh reference matcher's, at the logits
    width of the tiny model's real tokenizer, over draft rows (valid and junk drafts), -1
    placeholder draft rows, chunked prefill, resumed and recycled slots, chunked calls and
    steps vLLM skips; plain rows are untouched."""
    counts = check_counts("grammar_masks", scenarios)
    kinds = {"grammar", "json_schema", "regex", "structural_tag"}
    assert set(counts["kinds"]) == kinds, counts["kinds"]
    assert counts["host_fetches"] >= 30, counts  # the fetch ran, once per constrained call


def test_penalty_scope(scenarios: dict[str, Future]) -> None:
    """Penalties that spare the structure (``penalize_structure`` off) under V2, with the
    grammar first: a structure row keeps the masked logits bit for bit; an open row gets
    the penalties over the content tokens only (committed and content drafts), as a
    from-scratch reference classifies them; windows, drafts, preemption, chunked calls."""
    check_counts("penalty_scope", scenarios)


def test_budget_closing(scenarios: dict[str, Future]) -> None:
    """``close_at_max_tokens`` on vLLM's real V2 sampler: every row allows a subset of what the
    grammar allows, and every request, drafts accepted where its rows allow them, preempted
    and resumed mid-closing, ends with end-of-sequence by ``max_tokens``, its output
    complete."""
    check_counts("budget_closing", scenarios)


def test_reasoning(scenarios: dict[str, Future]) -> None:
    """``reasoning_end`` on vLLM's real V2 sampler: thinking rows untouched but for
    end-of-sequence, the request's stop tokens and tokens that would complete the marker
    with text after it (or forced to the marker), rows after the marker within the grammar,
    every request complete, over drafts, placeholders, the prompt's end read in the step's one
    copy, preemption and chunked calls."""
    check_counts("reasoning", scenarios)


def test_penalty_placeholders(scenarios: dict[str, Future]) -> None:
    """Rows of a step that starts inside the prefill get -1 placeholder drafts from vLLM:
    penalised rows must not count token ``vocab - 1`` for them (twins and windows)."""
    check_counts("penalty_placeholders", scenarios)


def test_truncation_samplers(scenarios: dict[str, Future]) -> None:
    """Top-n-sigma, typical-p and XTC rows keep exactly the reference's tokens (XTC's draw at
    the row's own position), over draft and placeholder rows, chunked prefill, resumed and
    recycled slots and chunked calls; plain and greedy rows untouched; no host reads."""
    counts = check_counts("truncation_samplers", scenarios)
    assert counts["host_fetches"] == 0, counts


def test_ngram_sampler(scenarios: dict[str, Future]) -> None:
    """``no_repeat_ngram_size`` rows ban exactly the reference's tokens for the output each row
    sees (committed tokens, then the drafts before it), with windows and whitelists, over
    draft and placeholder rows, resumed and recycled slots and chunked calls; no host reads."""
    counts = check_counts("ngram_sampler", scenarios)
    assert counts["host_fetches"] == 0, counts


def test_dry_sampler(scenarios: dict[str, Future]) -> None:
    """DRY rows equal a line-by-line port of llama.cpp's ``llama_sampler_dry_apply`` for the
    tokens each row sees (prompt, committed output, drafts), breakers from the tiny model's
    real tokenizer, over draft and placeholder rows, resumed and recycled slots and chunked
    calls; bit for bit, after vLLM's own temperature; no host reads."""
    counts = check_counts("dry_sampler", scenarios)
    assert counts["host_fetches"] == 0, counts


def test_tensor_parallel_ranks(scenarios: dict[str, Future]) -> None:
    """Two sets of our processors, as two tensor-parallel ranks build them, driven through the
    same steps of vLLM's real V2 sampler hand on bit-identical logits at every row of every
    step: every option kind mixed (grammars, unseeded XTC, penalties, DRY, no-repeat-ngram,
    min-p), drafts, placeholders, chunked prefill, preemption; no host reads beyond the
    grammar mask's fetch."""
    check_counts("tensor_parallel_ranks", scenarios)
