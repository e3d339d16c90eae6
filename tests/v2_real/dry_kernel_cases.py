"""DRY's Triton kernels (``processors/dry_kernel.py``) against the torch form, in Triton's
interpreter: prints ``DRYKERNEL`` and the JSON of what it compared.

Run in a fresh process (``python -m tests.v2_real.dry_kernel_cases [CASES]``): it imports the
V2 harness first, which makes Triton interpret on CPU. Each generated case is one V2 step's
context (slots, committed tokens in a token table whose unused tail holds stale ids, logits rows
with drafts before them, ``-1`` placeholder drafts) and the processor's per-slot columns
(windows, allowed lengths, bases with and without the exponent clamp, caps, breaker lists,
slots without DRY mixed in). The torch form is what the processor ran before the kernels:
``history.device_history``, ``BreakerMasks.lookup``, ``dry_math.repeat_lengths`` and
``dry_math.dry_penalize``; the logits must match bit for bit. Half the cases run with a narrow
block so that rows span several programs. Then ``multiplier * base ** e`` alone, over many
values, against torch's float64 ``pow``. ``tests/test_dry.py`` runs this and checks the JSON.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import json
import random
import sys
from types import SimpleNamespace

import numpy as np
import torch
from vllm.triton_utils import tl, triton

from constrained.processors import dry_kernel
from constrained.processors.dry_math import dry_penalize, max_exponent, repeat_lengths
from constrained.processors.history import device_history, device_width

BASES = [1.0, 1.0000005, 1.1, 1.75, 3.0, 50.0, 1e30]


def make_case(rng: random.Random) -> dict:
    """One step: requests (some without DRY), their rows, columns and breaker lists."""
    vocab = rng.choice([8, 16, 64])
    max_len = rng.choice([64, 160, 300])
    num_slots = rng.randint(1, 6)
    num_lists = rng.choice([0, 1, 3])
    table = torch.rand(num_lists, vocab) < rng.choice([0.02, 0.1, 0.3])
    tokens = torch.randint(0, vocab, (num_slots, max_len), dtype=torch.int32)  # stale tails
    cols = {
        "dry_multiplier": torch.zeros(num_slots, dtype=torch.float32),
        "dry_base": torch.full((num_slots,), 1.75, dtype=torch.float32),
        "dry_allowed": torch.full((num_slots,), 2, dtype=torch.int64),
        "dry_window": torch.zeros(num_slots, dtype=torch.int64),
        "dry_cap": torch.zeros(num_slots, dtype=torch.int64),
        "dry_exponent_cap": torch.zeros(num_slots, dtype=torch.int64),
        "dry_breakers": torch.zeros(num_slots, dtype=torch.int64),
    }
    row_slots, pos, local, input_ids, req_slots, upper = [], [], [], [], [], []
    for slot in rng.sample(range(num_slots), rng.randint(1, num_slots)):
        if rng.random() < 0.8:  # a DRY request, as DryProcessor.fill_slot writes it
            base = rng.choice(BASES)
            allowed = rng.choice([1, 2, 3, 5])
            cap_len = rng.choice([max_len, 4, 8])
            exponent_cap = max_exponent(base)
            cap = allowed + exponent_cap if exponent_cap else cap_len
            cols["dry_multiplier"][slot] = rng.choice([0.8, 2.0, 1e-3, 3e37, 1e38])  # 1e38: held
            cols["dry_base"][slot] = base
            cols["dry_allowed"][slot] = allowed
            cols["dry_window"][slot] = rng.choice([0, 0, 1, 3, 8, 40])
            cols["dry_cap"][slot] = min(cap, cap_len)
            cols["dry_exponent_cap"][slot] = exponent_cap
            cols["dry_breakers"][slot] = rng.randrange(num_lists) if num_lists else 0
        # committed tokens: a repetitive sequence of a few ids (long repeats)
        total = rng.randint(1, max_len - 8)
        pattern = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        seq = [rng.choice(pattern) if rng.random() < 0.9 else rng.randrange(vocab)
               for _ in range(total)]  # fmt: skip
        if rng.random() < 0.5:
            seq = (pattern * total)[:total]
        tokens[slot, :total] = torch.tensor(seq, dtype=torch.int32)
        num_drafts = rng.choice([0, 0, 1, 3])
        placeholder = rng.random() < 0.2
        drafts = [-1 if placeholder else rng.choice(pattern) for _ in range(num_drafts)]
        fed = [seq[-1], *drafts]  # row i is fed the token at position total - 1 + i
        for i in range(num_drafts + 1):
            row_slots.append(slot)
            pos.append(total - 1 + i)
            local.append(i)
            input_ids.append(fed[i])
        req_slots.append(slot)
        upper.append(total + num_drafts)
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor(row_slots, dtype=rng.choice([torch.int32, torch.int64])),
        pos=torch.tensor(pos, dtype=torch.int64),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.tensor(input_ids, dtype=torch.int32),
        idx_mapping_np=np.array(req_slots, dtype=np.int64),
        seq_lens_upper_bound_np=np.array(upper, dtype=np.int32),
    )
    logits = torch.randn(len(row_slots), vocab) * 3
    if rng.random() < 0.3:
        logits[torch.rand_like(logits) < 0.1] = float("-inf")
    return {"ctx": ctx, "tokens": tokens, "cols": cols, "table": table, "logits": logits}


def torch_form(case: dict, width: int) -> torch.Tensor:
    """What ``DryProcessor.apply_rows`` computed under V2 before the kernels."""
    ctx, cols, table = case["ctx"], case["cols"], case["table"]
    logits = case["logits"].clone()
    if width < 2:
        return logits
    slots = ctx.expanded_idx_mapping.long()
    first = torch.zeros(len(slots), dtype=torch.long)
    history = device_history(ctx, case["tokens"], slots, first, cols["dry_window"][slots], width)
    if table.shape[0] == 0:
        breaker = torch.zeros_like(history, dtype=torch.bool)
    else:
        lists = cols["dry_breakers"][slots]
        breaker = table[lists.unsqueeze(1), history.clamp(min=0)] & (history >= 0)
    active = cols["dry_cap"] > 0
    max_cap = int(cols["dry_cap"][active].max()) if bool(active.any()) else 0
    lengths = repeat_lengths(history, breaker, cols["dry_cap"][slots], max_cap)
    return dry_penalize(
        logits, history, lengths, breaker, cols["dry_allowed"][slots],
        cols["dry_multiplier"][slots], cols["dry_base"][slots], cols["dry_exponent_cap"][slots],
    )  # fmt: skip


def kernel_form(case: dict, width: int) -> torch.Tensor:
    logits = case["logits"].clone()
    return dry_kernel.dry_penalize_kernel(
        logits, case["ctx"], case["tokens"], case["cols"], case["table"], width
    )


@triton.jit
def _pow_probe_kernel(base_ptr, multiplier_ptr, exponent_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    base = tl.load(base_ptr + i, mask=ok, other=1.0).to(tl.float64)
    exponent = tl.load(exponent_ptr + i, mask=ok, other=0)
    power = dry_kernel._pow_int(base, exponent)
    multiplier = tl.load(multiplier_ptr + i, mask=ok, other=0.0).to(tl.float64)
    tl.store(out_ptr + i, (multiplier * power).to(tl.float32), mask=ok)


def pow_check(count: int) -> dict:
    """``multiplier * base ** e`` (float32 values, float64 product, float32 result) against
    torch's, for bases over llama.cpp's range and exponents up to each base's clamp (400
    without one), as the kernel meets them."""
    gen = torch.Generator().manual_seed(5)
    base = torch.exp(torch.rand(count, generator=gen, dtype=torch.float64) * 4).float()
    base[: count // 8] = torch.tensor(BASES * count, dtype=torch.float32)[: count // 8]
    caps = torch.tensor([max_exponent(float(b)) or 400 for b in base.tolist()])
    exponent = (torch.rand(count, generator=gen) * (caps + 1)).long().clamp(max=caps)
    multiplier = (torch.rand(count, generator=gen) * 4).float()
    want = (multiplier.double() * base.double() ** exponent.double()).float()
    got = torch.empty(count, dtype=torch.float32)
    _pow_probe_kernel[(triton.cdiv(count, 4096),)](
        base, multiplier, exponent, got, count, BLOCK=4096
    )
    differ = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten().tolist()
    return {
        "pow_values": count,
        "pow_finite": int(torch.isfinite(want).sum()),
        "pow_mismatches": [
            (float(base[i]), int(exponent[i]), float(multiplier[i]), float(got[i]), float(want[i]))
            for i in differ[:5]
        ],
        "pow_mismatch_count": len(differ),
    }


def main(argv: list[str]) -> int:
    assert harness.INTERPRETED
    count = int(argv[0]) if argv else 300
    rng = random.Random(11)
    torch.manual_seed(11)
    stats = {"cases": 0, "rows": 0, "rows_penalized": 0, "draft_rows_penalized": 0,
             "placeholder_rows": 0, "multi_chunk_cases": 0, "inactive_rows": 0,
             "no_breaker_cases": 0, "mismatches": []}  # fmt: skip
    wide = dry_kernel.BLOCK
    for case_no in range(count):
        case = make_case(rng)
        dry_kernel.BLOCK = wide if case_no % 2 else rng.choice([8, 16, 32])
        ctx = case["ctx"]
        first = np.zeros(len(ctx.idx_mapping_np), dtype=np.int64)
        windows = case["cols"]["dry_window"].numpy()[ctx.idx_mapping_np]
        active = case["cols"]["dry_cap"].numpy()[ctx.idx_mapping_np] > 0
        width = device_width(ctx, first, windows, active)
        want = torch_form(case, width)
        got = kernel_form(case, width)
        same = (got.view(torch.int32) == want.view(torch.int32)).all(1)
        changed = (want.view(torch.int32) != case["logits"].view(torch.int32)).any(1)
        slots = ctx.expanded_idx_mapping.long()
        stats["cases"] += 1
        stats["rows"] += len(slots)
        stats["rows_penalized"] += int(changed.sum())
        stats["draft_rows_penalized"] += int((changed & (ctx.expanded_local_pos > 0)).sum())
        stats["placeholder_rows"] += int((ctx.input_ids < 0).sum())
        stats["multi_chunk_cases"] += int(triton.cdiv(max(width, 1), dry_kernel.BLOCK) > 1)
        stats["inactive_rows"] += int((case["cols"]["dry_cap"][slots] == 0).sum())
        stats["no_breaker_cases"] += int(case["table"].shape[0] == 0)
        for row in (~same).nonzero().flatten().tolist()[:2]:
            slot = int(slots[row])
            stats["mismatches"].append({
                "case": case_no, "row": row, "block": dry_kernel.BLOCK, "width": width,
                "slot": slot, "pos": int(ctx.pos[row]), "local": int(ctx.expanded_local_pos[row]),
                "cols": {k: v[slot].item() for k, v in case["cols"].items()},
                "got": got[row].tolist(), "want": want[row].tolist(),
            })  # fmt: skip
    dry_kernel.BLOCK = wide
    stats.update(pow_check(20000))
    print("DRYKERNEL " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
