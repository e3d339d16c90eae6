"""Kernel launches and host syncs per decoding step, per processor configuration, counted on CPU.

Run in a fresh process (``python -m tests.v2_real.launch_counts [--json PATH]``): it imports
the V2 harness (vLLM's real Model Runner V2 sampler, Triton in its interpreter). On a GPU each
of these is one kernel launch:

- every ATen operation that computes (views, reshapes and allocations are free: they launch
  nothing), counted by a ``TorchDispatchMode`` active while the step runs;
- every Triton kernel launch (the interpreter's ``run``; its own insides are not counted).

Host syncs are the sync guard's fetches (``transfer.fetch_to_host``): any other host read in
our processors already fails the guard. For each configuration, ``B`` requests are admitted,
prefilled and decoded ``STEPS`` steps; the counts are those of the last step (steady state),
split by stage: each of our processors' ``apply``, vLLM's built-in stages, and the whole
``Sampler.apply_sampling_params``. ``tests/test_launch_counts.py`` holds the budgets.
"""

from tests.v2_real import harness  # first: patches Triton/torch before vLLM is imported

# ruff: noqa: I001
import argparse
import functools
import json
import os
import random
import sys
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vllm import SamplingParams

from tests.v2_real.harness import Plan, Req, V2Runner

# Count what a GPU launches: the truncation samplers' Triton kernels, which are off by default
# under the interpreter (settings.py), and compile them for the GPU (cuda_compile.py).
os.environ["CONSTRAINED_TRUNCATION_KERNELS"] = "1"

VOCAB = 4096
BATCH = 4
PROMPT_LEN = 12
STEPS = 3
BIAS = {t: 3.0 for t in range(100, 1100, 100)}
PEN = {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.3}

# ATen ops that launch nothing on a GPU: views, metadata, allocations.
FREE_OPS = frozenset(
    {
        "view", "_unsafe_view", "t", "unsqueeze", "squeeze", "expand", "slice", "select",
        "as_strided", "alias", "detach", "_reshape_alias", "permute", "transpose", "split",
        "unbind", "narrow", "lift_fresh", "empty", "empty_strided", "empty_like", "reshape",
        "flatten", "view_as", "expand_as", "_to_copy_noop", "resolve_conj", "resolve_neg",
        "set_", "is_pinned", "sym_size", "sym_stride", "dim", "size", "stride",
    }
)  # fmt: skip


def configs() -> dict[str, SamplingParams]:
    """Each configuration's request parameters (all requests of a run get the same)."""

    def ours(**extra: Any) -> SamplingParams:
        return SamplingParams(temperature=1.0, extra_args=extra)

    return {
        "none": SamplingParams(temperature=1.0),
        "logit_bias": ours(logit_bias=BIAS),
        "penalties": ours(**PEN),
        "penalties_window": ours(**PEN, penalty_last_n=8, penalty_scope="prompt_and_output"),
        "min_p": ours(min_p=0.05),
        "pen_bias_minp": ours(**PEN, logit_bias=BIAS, min_p=0.05),
        "vllm_builtin_pen_bias_minp": SamplingParams(
            temperature=1.0, logit_bias=BIAS, min_p=0.05, **PEN
        ),
        "dry": ours(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2),
        "no_repeat_ngram": ours(no_repeat_ngram_size=3),
        "top_n_sigma": ours(top_n_sigma=1.0),
        "typical_p": ours(typical_p=0.9),
        "xtc": SamplingParams(
            temperature=1.0, seed=7, extra_args={"xtc_probability": 1.0, "xtc_threshold": 0.1}
        ),
        "pen_bias_minp_dry": ours(**PEN, logit_bias=BIAS, min_p=0.05, dry_multiplier=0.8),
    }


class LaunchCounter(TorchDispatchMode):
    """Counts computing ATen ops and Triton launches, by the stage that is running."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = "other"
        self.ops: Counter[str] = Counter()
        self.triton: Counter[str] = Counter()
        self.names: dict[str, Counter[str]] = {}
        self.paused = 0
        self.recording = False
        self.variants: dict[str, dict] = {}  # our kernels as launched (``--variants``)
        self.parsed: dict = {}  # kernel function -> its JITFunction, parsed once

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        if self.recording and not self.paused:
            name = func.overloadpacket.__name__
            if name not in FREE_OPS and not getattr(func, "is_view", False):
                self.ops[self.stage] += 1
                self.names.setdefault(self.stage, Counter())[name] += 1
        return func(*args, **(kwargs or {}))

    def in_stage(self, stage: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            outer, self.stage = self.stage, stage
            try:
                return fn(*args, **kwargs)
            finally:
                self.stage = outer

        return run

    def remember_variant(self, fn: Any, args: tuple, kwargs: dict) -> None:
        """One of our kernels as launched: its argument types and constexpr values, for
        ``tests/v2_real/cuda_compile.py`` to compile for the GPU in a process of its own."""
        from triton.runtime.jit import JITFunction

        jit = self.parsed.get(fn) or self.parsed.setdefault(fn, JITFunction(fn))
        values = dict(zip(jit.arg_names, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in jit.arg_names})
        signature, constexprs = {}, {}
        for param in jit.params:
            value = values[param.name]
            if param.is_constexpr:
                signature[param.name], constexprs[param.name] = "constexpr", value
            else:
                signature[param.name] = triton_type(value)
        variant = {"module": fn.__module__, "name": fn.__qualname__, "signature": signature,
                   "constexprs": constexprs, "num_warps": kwargs.get("num_warps", 4)}  # fmt: skip
        self.variants.setdefault(json.dumps(variant, sort_keys=True), variant)

    def install_triton(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        original = InterpretedFunction.run
        counter = self

        def run(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(fn_self.fn, "__module__", "").startswith("constrained."):
                counter.remember_variant(fn_self.fn, args, kwargs)
            if counter.recording and not counter.paused:
                counter.triton[counter.stage] += 1
                name = getattr(fn_self.fn, "__name__", "?")
                counter.names.setdefault(counter.stage, Counter())["triton:" + name] += 1
            counter.paused += 1
            try:
                return original(fn_self, *args, **kwargs)
            finally:
                counter.paused -= 1

        InterpretedFunction.run = run


TRITON_TYPES = {
    torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "i1",
}  # fmt: skip


def triton_type(value: Any) -> str:
    """A launch argument's Triton signature type (tensors are pointers)."""
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unexpected Triton argument {value!r}")


def instrument(runner: V2Runner, counter: LaunchCounter) -> None:
    sampler = runner.sampler
    for proc in runner.custom:
        proc.apply = counter.in_stage(type(proc).__name__, proc.apply)
    for state in sampler.logits_processors:
        if state not in runner.custom:
            state.apply = counter.in_stage("vllm:" + type(state).__name__, state.apply)
    states = sampler.sampling_states
    states.apply_temperature = counter.in_stage("vllm:temperature", states.apply_temperature)
    states.apply_min_p = counter.in_stage("vllm:min_p", states.apply_min_p)
    sampler.apply_sampling_params = counter.in_stage("sampler", sampler.apply_sampling_params)


def measure(runner: V2Runner, counter: LaunchCounter, name: str, params: SamplingParams) -> dict:
    rng = random.Random(len(name))
    reqs = [
        Req(f"{name}-{i}", params, [rng.randrange(VOCAB) for _ in range(PROMPT_LEN)])
        for i in range(BATCH)
    ]
    for req in reqs:
        runner.admit(req)
    gen = torch.Generator().manual_seed(1)
    plans = {r.req_id: Plan(prefill=PROMPT_LEN) for r in reqs}
    out: dict[str, Any] = {}
    for step_no in range(1 + STEPS):
        step = runner.prepare(plans)
        logits = torch.randn(step.num_rows, VOCAB, generator=gen)
        last = step_no == STEPS
        fetches = runner.sync_guard.fetches
        counter.ops.clear(), counter.triton.clear(), counter.names.clear()
        counter.recording = last
        with counter:
            processed = runner.process(step, logits)
        counter.recording = False
        if last:
            stages = sorted(set(counter.ops) | set(counter.triton))
            out = {
                "launches": {s: counter.ops[s] + counter.triton[s] for s in stages},
                "triton": {s: counter.triton[s] for s in stages if counter.triton[s]},
                "syncs": runner.sync_guard.fetches - fetches,
                "ops": {s: dict(counter.names[s]) for s in stages if s in counter.names},
            }
        best = processed.argmax(dim=1).tolist()
        # Repeat a token now and then so the penalties and DRY see repeats.
        runner.commit(step, {row.req.req_id: [best[row.index]] for row in step.rows})
        plans = {r.req_id: Plan() for r in reqs}
    for req in reqs:
        runner.finish(req)
    total = out["launches"]
    theirs = ("vllm:", "sampler", "other")  # vLLM's stages, its copy, the harness's clone
    out["ours"] = sum(v for k, v in total.items() if not k.startswith(theirs))
    # the sampler's own launches include every stage's; "step" is the whole call
    out["step"] = sum(total.values())
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="")
    parser.add_argument("--only", default="")
    parser.add_argument("--variants", default="", help="where to write our kernels' variants")
    args = parser.parse_args(argv)
    harness.check_vllm_internals()
    config = harness.make_vllm_config(BATCH, 0, 256, 512)
    runner = V2Runner(
        config, max_num_reqs=BATCH, vocab_size=VOCAB, num_spec=0, max_model_len=256,
        max_num_batched_tokens=512,
    )  # fmt: skip
    counter = LaunchCounter()
    counter.install_triton()
    instrument(runner, counter)
    only = [s for s in args.only.split(",") if s]
    results = {}
    for name, params in configs().items():
        if only and name not in only:
            continue
        results[name] = measure(runner, counter, name, params)
        r = results[name]
        print(f"{name:28s} step {r['step']:4d} launches (ours {r['ours']:3d}), "
              f"syncs {r['syncs']}: {r['launches']}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vocab": VOCAB, "batch": BATCH, "results": results}, f, indent=1)
    summary = {k: {"step": v["step"], "ours": v["ours"], "syncs": v["syncs"]}
               for k, v in results.items()}  # fmt: skip
    print("LAUNCHCOUNTS " + json.dumps(summary))
    if args.variants:
        with open(args.variants, "w") as f:
            json.dump(list(counter.variants.values()), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
