"""XTC's Triton kernel (``truncation_kernels.xtc_kernel``) against the torch path it replaces
under V2 (``truncation_math.uniform_hash`` draw, ``xtc_bounds``, ``mask_outside``), bit for bit,
in Triton's interpreter: prints ``XTCKERNEL`` and the JSON of the mismatches and coverage.

Run in a fresh process (``python -m tests.v2_real.xtc_kernel_cases``): it imports the V2
harness first, which makes Triton interpret on CPU. Two parts:

- the draw alone (``_xtc_draw``, through a one-line kernel), against ``uniform_hash(seed,
  pos + 1) < xtc_probability`` over random and extreme seeds, positions and probabilities;
- whole calls on generated rows: slots off (probability 0, as greedy requests and requests
  without XTC), probabilities 1 and between, thresholds from 0.01 to 0.5, logits with a few
  tokens lifted so that several qualify, ties at the top and at the least qualifying logit,
  ``-inf`` entries, rows all ``-inf``, one-token vocabularies, and rows wider than a chunk.

``tests/test_truncation_samplers.py`` asserts no mismatch and the coverage.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import json
import random
from collections import Counter

import torch
from vllm.triton_utils import tl, triton

from constrained.processors.truncation_kernels import CHUNK, _xtc_draw, xtc_kernel
from constrained.processors.truncation_math import mask_outside, uniform_hash, xtc_bounds

SLOTS = 12


@triton.jit
def _draws_kernel(row_slots_ptr, pos_ptr, probability_ptr, seed_ptr, out_ptr):
    row = tl.program_id(0).to(tl.int64)
    _slot, applies = _xtc_draw(row, row_slots_ptr, pos_ptr, probability_ptr, seed_ptr)
    tl.store(out_ptr + row, applies.to(tl.int8))


def check_draws(rng: random.Random, count: int = 1500) -> tuple[int, int]:
    """How many of ``count`` draws differ from the torch path's, and how many applied."""
    seeds = [0, 1, 2**31, 2**32 - 1] + [rng.randrange(2**32) for _ in range(count - 4)]
    pos = [0, 2**31 - 2, 5, 1] + [rng.choice([rng.randrange(64), rng.randrange(2**31 - 1)])
                                  for _ in range(count - 4)]  # fmt: skip
    probability = torch.tensor([rng.choice([0.0, 1.0, rng.random()]) for _ in range(count)])
    seed = torch.tensor(seeds, dtype=torch.int64)
    positions = torch.tensor(pos, dtype=torch.int64)
    want = uniform_hash(seed, positions + 1) < probability
    out = torch.empty(count, dtype=torch.int8)
    slots = torch.arange(count, dtype=torch.int64)
    _draws_kernel[(count,)](slots, positions, probability.float(), seed, out)
    return int((out.bool() != want).sum()), int(want.sum())


def make_call(rng: random.Random, gen: torch.Generator) -> dict:
    """One call's columns, row layout and logits, and what each row is (for the coverage)."""
    vocab = rng.choice([1, 7, 100, 100, 2048, 2048, CHUNK + 7000])
    probability = torch.zeros(SLOTS, dtype=torch.float32)
    threshold = torch.full((SLOTS,), 0.1, dtype=torch.float32)  # the column's fill
    seed = torch.zeros(SLOTS, dtype=torch.int64)
    for slot in range(SLOTS):
        if rng.random() < 0.75:
            probability[slot] = rng.choice([1.0, 1.0, 0.5, 0.2, 0.9])
            threshold[slot] = rng.choice([0.01, 0.05, 0.1, 0.1, 0.2, 0.5])
            seed[slot] = rng.randrange(2**32)
    rows = rng.randint(1, 8 if vocab <= CHUNK else 2)
    row_slots = torch.tensor([rng.randrange(SLOTS) for _ in range(rows)], dtype=torch.int64)
    pos = torch.tensor([rng.randrange(4096) for _ in range(rows)], dtype=torch.int64)
    logits = torch.randn(rows, vocab, generator=gen) * rng.choice([0.5, 1.0, 3.0])
    kinds = []
    for r in range(rows):
        kind = rng.choice(["lifted", "lifted", "tie_top", "tie_least", "masked", "all_masked"])
        lifted = torch.randperm(vocab, generator=gen)[: rng.randint(1, 5)]
        logits[r, lifted] += rng.choice([4.0, 6.0, 12.0])
        if kind == "tie_top" and vocab > 2:
            top = logits[r].argmax()
            logits[r, (top + 1) % vocab] = float(logits[r, top])
        elif kind == "tie_least" and lifted.numel() >= 2:
            least = float(logits[r, lifted].min())  # tokens tied with the least lifted one
            logits[r, torch.randperm(vocab, generator=gen)[:2]] = least
        elif kind == "masked":
            logits[r, torch.rand(vocab, generator=gen) < 0.5] = -torch.inf
        elif kind == "all_masked":
            logits[r] = -torch.inf
        else:
            kind = "lifted"
        kinds.append(kind)
    return {"probability": probability, "threshold": threshold, "seed": seed,
            "row_slots": row_slots, "pos": pos, "logits": logits, "kinds": kinds}  # fmt: skip


def torch_path(call: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``XtcProcessor``'s ``TensorMask`` path under V2: the logits after it, and the draws."""
    slots = call["row_slots"]
    applies = uniform_hash(call["seed"][slots], call["pos"] + 1) < call["probability"][slots]
    _, high = xtc_bounds(call["logits"].clone(), call["threshold"][slots], applies)
    return mask_outside(call["logits"].clone(), None, high), applies


def main() -> None:
    assert harness.INTERPRETED
    rng = random.Random(57)
    gen = torch.Generator().manual_seed(57)
    draw_mismatches, draws_applied = check_draws(rng)
    mismatches: list[str] = []
    covered: Counter[str] = Counter({"draws_applied": draws_applied})
    for case in range(220):
        call = make_call(rng, gen)
        want, applies = torch_path(call)
        got = xtc_kernel(
            call["logits"].clone(), call["row_slots"], call["pos"], call["probability"],
            call["threshold"], call["seed"],
        )  # fmt: skip
        differ = (got.view(torch.int32) != want.view(torch.int32)).any(1)
        if differ.any():
            mismatches.append(f"case {case}: rows {differ.nonzero().flatten().tolist()}")
        for r, kind in enumerate(call["kinds"]):
            probability = float(call["probability"][call["row_slots"][r]])
            changed = not torch.equal(want[r], call["logits"][r])
            covered["rows"] += 1
            covered["rows_off"] += probability == 0.0
            covered["rows_drawn_out"] += 0.0 < probability < 1.0 and not bool(applies[r])
            covered["rows_drawn_in"] += 0.0 < probability < 1.0 and bool(applies[r])
            covered[f"{kind}_rows_truncated"] += changed
            covered[f"{kind}_rows_applied_untouched"] += bool(applies[r]) and not changed
            covered["wide_rows_truncated"] += changed and call["logits"].shape[1] > CHUNK
    print("XTCKERNEL " + json.dumps({"draw_mismatches": draw_mismatches, "mismatches": mismatches,
                                     "covered": dict(covered)}))  # fmt: skip


if __name__ == "__main__":
    main()
