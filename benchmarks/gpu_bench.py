"""(c) of ``make gpu-check``: the kit's per-step bench, with the processors it does not list.

The kit's ``bench.py`` times penalties + bias + min_p, DRY, typical-p, top-n-sigma and the
llguidance JSON mask. This adds XTC, no-repeat-ngram and the xgrammar JSON mask (its batched
fill), then runs the kit's ``main`` unchanged: same requests, same timing, same JSON.

Runs inside ``benchmarks/gpu_check.py``'s child process (the kit on ``sys.path``).
"""

from __future__ import annotations

import sys

import bench  # the kit's bench.py
from vllm import SamplingParams

_KIT_CONFIGS = bench.configs


def configs() -> dict[str, SamplingParams]:
    more = {
        "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.1},
        "no_repeat_ngram": {"no_repeat_ngram_size": 3},
        "json_schema_xgrammar": {"json_schema": bench.SCHEMA, "grammar_backend": "xgrammar"},
    }
    params = {name: SamplingParams(temperature=1.0, max_tokens=64, extra_args=extra)
              for name, extra in more.items()}  # fmt: skip
    return {**_KIT_CONFIGS(), **params}


bench.configs = configs

if __name__ == "__main__":
    sys.exit(bench.main())
