"""What the nine installed processors' hooks cost requests that use none of our options (#29),
without an engine: vLLM's real admission (``InputProcessor._validate_params``, which calls
every entry point's ``validate_params``) and simulated Model Runner V1 batch updates.

The processors are built as vLLM builds them for ``LLM(model)`` (no flag, entry points
active) on the tiny model's config. Medians, in microseconds unless named otherwise:

- ``admission_us``: one request's admission (vLLM's own checks included);
  ``vllm_admission_us``: the same with no custom validator (vLLM's own checks alone);
- ``idle_step_us``: one step, ``update_state(None)`` then ``apply`` on each processor;
- ``step_with_update_us``: the same with a batch update that moves one row;
- ``add_64_ms`` / ``remove_64_ms``: 64 plain requests joining / leaving in one update.

    python -m benchmarks.plugin_hooks          # ~30 s, no engine
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from benchmarks.common import machine_info

BATCH = 64


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)

    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

    from constrained.demo import engine_kwargs
    from constrained.plugin import ENTRY_POINT_CLASSES
    from constrained.tiny_model import build_tiny_model

    config = EngineArgs(model=str(build_tiny_model()), **engine_kwargs()).create_engine_config()
    frontend = InputProcessor(config)
    procs = [cls(config, torch.device("cpu"), False) for cls in ENTRY_POINT_CLASSES]
    logits = torch.zeros(BATCH, config.model_config.get_vocab_size())

    def admission(n: int = 2000) -> float:
        times = []
        for i in range(n):
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=64)
            start = time.perf_counter()
            frontend._validate_params(params, ("generate",))
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    def vllm_admission() -> float:
        real = frontend.validate_logits_processors_params
        frontend.validate_logits_processors_params = lambda params: None
        try:
            return admission()
        finally:
            frontend.validate_logits_processors_params = real

    def one_round(steps: int) -> dict[str, float]:
        added = [(i, SamplingParams(temperature=1.0, seed=i), [1, 2, 3], []) for i in range(BATCH)]
        join = BatchUpdate(BATCH, [], added, [])
        leave = BatchUpdate(0, list(range(BATCH)), [], [])
        move = BatchUpdate(BATCH, [], [], [(BATCH - 1, 0, MoveDirectionality.UNIDIRECTIONAL)])
        start = time.perf_counter()
        for proc in procs:
            proc.update_state(join)
        add_s = time.perf_counter() - start
        idle, moving = [], []
        for update, times in ((None, idle), (move, moving)):
            for _ in range(steps):
                start = time.perf_counter()
                for proc in procs:
                    proc.update_state(update)
                for proc in procs:
                    proc.apply(logits)
                times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for proc in procs:
            proc.update_state(leave)
        return {
            "idle_step_us": statistics.median(idle) * 1e6,
            "step_with_update_us": statistics.median(moving) * 1e6,
            "add_64_ms": add_s * 1e3,
            "remove_64_ms": (time.perf_counter() - start) * 1e3,
        }

    rounds = [one_round(300) for _ in range(20)]
    result = {
        "admission_us": admission(),
        "vllm_admission_us": vllm_admission(),
        **{key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
    }
    record = {
        "command": "python -m benchmarks.plugin_hooks " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "result": result,
    }
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plugin_hooks.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({key: round(value, 2) for key, value in result.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
