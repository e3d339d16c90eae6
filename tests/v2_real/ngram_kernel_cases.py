"""No-repeat-ngram's Triton kernel (``processors/ngram_kernel.py``) against the torch path it
replaces (``history.device_history`` + ``ngram_math.repeated_ngram_bans`` + ``ban_tokens``),
bit for bit, on generated V2 steps, in Triton's interpreter: prints ``NGRAMKERNEL`` and the
JSON of the mismatches and what the cases covered.

Run in a fresh process (``python -m tests.v2_real.ngram_kernel_cases``): it imports the V2
harness first, which makes Triton interpret on CPU. Each case is one step: requests with 1-4
rows each (drafts fed before a row, ``-1`` placeholders among them), committed tokens with a
few ``-1``, prompt lengths, windows, whitelists, ``n`` from 1 to 6, rows with the option off
among active ones, a host width bound that is sometimes tighter than a row's history, and
logits rows that the bans would empty (masked down to the banned tokens, or all ``-inf``),
with the one surviving token sometimes in the last vocabulary block. ``tests/
test_no_repeat_ngram.py`` asserts no mismatch and the coverage.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import json
import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import torch

from constrained.processors.history import device_history, device_width
from constrained.processors.ngram_kernel import VOCAB_BLOCK, ban_repeated_ngrams_kernel
from constrained.processors.ngram_math import ban_tokens, repeated_ngram_bans

SLOTS, MAX_LEN = 12, 96


def committed(rng: random.Random, vocab: int) -> list[int]:
    """A slot's committed tokens: random, or a short period with some noise (long n-grams
    repeat), with a few ``-1``."""
    period = [rng.randrange(vocab) for _ in range(rng.randint(2, 5))]
    periodic = rng.random() < 0.5
    out = []
    for i in range(MAX_LEN):
        token = period[i % len(period)] if periodic and rng.random() < 0.9 else rng.randrange(vocab)
        out.append(token if rng.random() > 0.03 else -1)
    return out


def make_step(rng: random.Random) -> dict:
    """One step's request state, context and per-slot columns (see the module docstring)."""
    vocab = rng.choice([5, 12, 40, 300, VOCAB_BLOCK + 700])
    tokens = torch.tensor([committed(rng, vocab) for _ in range(SLOTS)], dtype=torch.int32)
    prompt_len = torch.tensor([rng.randrange(0, 20) for _ in range(SLOTS)], dtype=torch.int32)
    n = torch.zeros(SLOTS, dtype=torch.int64)
    window = torch.zeros(SLOTS, dtype=torch.int64)
    whitelist = torch.full((SLOTS, rng.choice([0, 4, 8])), -1, dtype=torch.int64)
    for slot in range(SLOTS):
        if rng.random() < 0.8:
            n[slot] = rng.choice([1, 2, 2, 3, 3, 4, 6])
            window[slot] = rng.choice([0, 0, 2, 5, 16])
            k = min(rng.randrange(whitelist.shape[1] + 1), vocab)
            whitelist[slot, :k] = torch.tensor(rng.sample(range(vocab), k), dtype=torch.int64)
    reqs = rng.sample(range(SLOTS), rng.randint(1, 6))
    row_slots, pos, local, input_ids, upper = [], [], [], [], []
    for slot in reqs:
        count = rng.choice([1, 1, 2, 4])  # rows: the drafts before each
        start = int(prompt_len[slot]) + rng.randrange(-2, 40)
        start = max(0, min(start, MAX_LEN - count))
        placeholder = rng.random() < 0.15
        for k in range(count):
            row_slots.append(slot), pos.append(start + k), local.append(k)
            if k == 0:
                input_ids.append(int(tokens[slot, start]))
            else:  # a draft: one of the request's own tokens (repeats), or a placeholder
                own = int(tokens[slot, rng.randrange(max(start, 1))])
                input_ids.append(-1 if placeholder else own)
        slack = rng.choice([0, 0, 0, 3, -3])  # sometimes a bound tighter than the history
        upper.append(max(start + count + slack, 0))
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor(row_slots, dtype=torch.int64),
        pos=torch.tensor(pos, dtype=torch.int64),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.tensor(input_ids, dtype=torch.int32),
        idx_mapping_np=np.array(reqs, dtype=np.intp),
        seq_lens_upper_bound_np=np.array(upper, dtype=np.int32),
    )
    return {"vocab": vocab, "tokens": tokens, "prompt_len": prompt_len, "n": n,
            "window": window, "whitelist": whitelist, "ctx": ctx}  # fmt: skip


def torch_path(step: dict, logits: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``NoRepeatNGramProcessor``'s torch path under V2: the logits after it, and the bans."""
    ctx, slots = step["ctx"], step["ctx"].expanded_idx_mapping
    active = (step["n"] > 0).numpy()
    max_n = int(step["n"][active].max()) if active.any() else 0
    history = device_history(
        ctx, step["tokens"], slots, step["prompt_len"][slots].long(), step["window"][slots], width
    )
    banned = repeated_ngram_bans(history, step["n"][slots], step["whitelist"][slots], max_n)
    bans = torch.where(banned, history, -1)
    if width == 0:  # the processor returns at once
        return logits, bans
    return ban_tokens(logits, history, banned), bans


def logits_for(step: dict, rng: random.Random, gen: torch.Generator, width: int) -> tuple:
    """Random rows; some masked down to their bans (then the bans would empty them, or leave
    one token, sometimes in the last vocabulary block), some all ``-inf``."""
    rows, vocab = step["ctx"].pos.shape[0], step["vocab"]
    logits = torch.randn(rows, vocab, generator=gen)
    _, bans = torch_path(step, logits.clone(), width)
    kinds = []
    for r in range(rows):
        kind = rng.choice(["plain"] * 5 + ["only_bans", "one_left", "all_masked"])
        banned = bans[r][bans[r] >= 0]
        if kind in ("only_bans", "one_left") and banned.numel():
            keep = logits[r, banned].clone()
            logits[r] = -torch.inf
            logits[r, banned] = keep
            free = sorted(set(range(vocab)) - set(banned.tolist()))
            kind = kind if free else "only_bans"
            if kind == "one_left":
                logits[r, free[-1] if rng.random() < 0.5 else rng.choice(free)] = 0.5
        elif kind == "all_masked":
            logits[r] = -torch.inf
        else:
            kind = "plain"
        kinds.append(kind)
    return logits, kinds


def main() -> None:
    assert harness.INTERPRETED
    rng = random.Random(57)
    gen = torch.Generator().manual_seed(57)
    mismatches: list[str] = []
    covered: Counter[str] = Counter()
    for case in range(260):
        step = make_step(rng)
        ctx = step["ctx"]
        active = (step["n"] > 0).numpy()[ctx.idx_mapping_np]
        first_np = step["prompt_len"].numpy()[ctx.idx_mapping_np].astype(np.int64)
        windows = step["window"].numpy()[ctx.idx_mapping_np]
        width = device_width(ctx, first_np, windows, active)
        logits, kinds = logits_for(step, rng, gen, width)
        want, bans = torch_path(step, logits.clone(), width)
        got = ban_repeated_ngrams_kernel(
            logits.clone(), ctx, step["tokens"], step["prompt_len"], step["n"],
            step["window"], step["whitelist"], width,
        )  # fmt: skip
        if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            rows = (got.view(torch.int32) != want.view(torch.int32)).any(1).nonzero().flatten()
            mismatches.append(f"case {case}: rows {rows.tolist()}")
        slots = ctx.expanded_idx_mapping
        for r in range(logits.shape[0]):
            n = int(step["n"][slots[r]])
            banning = bool((bans[r] >= 0).any())
            covered["rows"] += 1
            covered["rows_off"] += n == 0
            covered["rows_banning"] += banning
            covered[f"rows_banning_n{n}"] += banning
            covered["draft_rows_banning"] += banning and int(ctx.expanded_local_pos[r]) > 0
            covered["placeholder_rows"] += int(ctx.input_ids[r]) < 0
            covered["whitelisted_rows"] += n > 0 and bool((step["whitelist"][slots[r]] >= 0).any())
            covered["windowed_rows_banning"] += banning and int(step["window"][slots[r]]) > 0
            emptied = not bool((want[r] != -torch.inf).any()) or torch.equal(want[r], logits[r])
            covered[f"{kinds[r]}_rows_kept_whole"] += banning and emptied
            covered[f"{kinds[r]}_rows_banned"] += banning and not emptied
            wide = step["vocab"] > VOCAB_BLOCK
            covered["wide_vocab_rows_banning"] += banning and wide
        covered["tight_width_steps"] += bool(
            (ctx.seq_lens_upper_bound_np < ctx.pos.numpy().max() + 1).any()
        )
        covered["zero_width_steps"] += width == 0
    print("NGRAMKERNEL " + json.dumps({"mismatches": mismatches, "covered": dict(covered)}))


if __name__ == "__main__":
    main()
