"""Offline generation with per-request options (run: python examples/offline.py [MODEL_DIR])."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from vllm import LLM, SamplingParams

import constrained
from constrained import Options
from constrained.tiny_model import build_tiny_model

if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else str(build_tiny_model())
    llm = LLM(model=model, logits_processors=constrained.LOGITS_PROCESSORS, dtype="float32",
              enforce_eager=True, generation_config="vllm", max_model_len=1024)  # fmt: skip
    options = Options(repetition_penalty=1.2, penalty_last_n=64, min_p=0.05, logit_bias={11: 2.0})
    params = SamplingParams(
        temperature=0.8, seed=0, max_tokens=32, extra_args=options.to_extra_args()
    )
    plain = SamplingParams(temperature=0.8, seed=0, max_tokens=32)
    for label, p in [("plain", plain), ("with options", params)]:
        out = llm.generate(["Once upon a time"], p, use_tqdm=False)[0].outputs[0]
        print(f"{label:>12}: {out.text!r}")
