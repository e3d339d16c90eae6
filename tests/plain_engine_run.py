"""Run requests on an engine WITHOUT our processors and print their outputs as JSON.

Used by the pass-through test as a subprocess, so the session's engine (with processors)
and this baseline never share a process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    from constrained.demo import engine_kwargs

    model, requests_json = sys.argv[1], sys.argv[2]
    requests = json.loads(requests_json)
    llm = LLM(model=model, **engine_kwargs())
    prompts = [r["prompt"] for r in requests]
    params = [SamplingParams(**r["params"]) for r in requests]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = [
        {
            "token_ids": list(o.outputs[0].token_ids),
            "logprobs": [
                {str(k): v.logprob for k, v in step.items()}
                for step in (o.outputs[0].logprobs or [])
            ],
        }
        for o in outputs
    ]
    print("RESULT " + json.dumps(result))
