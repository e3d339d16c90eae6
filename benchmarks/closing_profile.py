"""Where closing's time goes in a mixed batch near its budget (#54), part by part, as the
fill thread's CPU time, without an engine.

The mixed-batch target (``budget_closing --schemas 64 --budgets 64``: closing on at 0.9x
or more of closing off's output tokens/s) is an engine run of about 20 minutes whose
rounds drift by up to 0.5x on a shared 2-core machine. This is its processor part, read
quietly: the V1 grammar processor alone, ``--schemas`` MaskBench schemas drawn as
``budget_closing`` draws them (those that compile and whose shortest completion fits
``--budget``), one request of each in a batch at ``max_tokens = --budget``, random logits,
each row's token sampled from its masked row, an ended request replaced by a fresh one of
its schema (every step a full batch), ``--steps`` steps, closing on and off in turn over
``--rounds`` rounds. The fill runs inline, so ``time.thread_time`` counts its Python and
the backends' single-thread work (llguidance's parallel fill of the rows runs in its own
threads: not counted, and the same with closing off).

Reported per step (medians of rounds): the processor's ``update_state`` + ``apply`` (the
fill, and the mask applied to the logits) with closing on and off, and closing's parts with
it on (inclusive: a walk inside a sort counts in both):

- ``rows``: all of closing's row work (``ClosingMatcher._narrow_own``);
- ``fresh_sorts`` / ``sorts_again``: near rows sorted anew, or an earlier sort reused
  (``RowSorter.sort_tokens`` / ``sorted_again``, with its classes sorted again);
- ``risers``: rows within reach, not near (``Risers.narrow``);
- ``checks`` / ``walks``: every token check, and the walks checks end in
  (``Checker.check`` / ``Checker._walked``).

``--tool-pairs N``: instead of schemas, N ``tool_choice: "required"`` requests over pairs
of Glaive tools (``benchmarks.tool_calls_cold``'s), each the structural tag vLLM's hermes
parser builds for them (its own ``get_hermes_structural_tag``), as the server's routing
passes it on (``openai_routing``: strict arguments). ``--named-tools N``: instead, the
parameters of N of those tools, each what a named ``tool_choice`` constrains the arguments
to (a JSON schema).

Writes ``closing_profile.json`` and ``closing_profile.png`` under ``--out``.

    python -m benchmarks.closing_profile                       # 64 drawn, budget 64
    python -m benchmarks.closing_profile --schemas 8 --steps 8 --rounds 1 --out /tmp/cp_smoke
    python -m benchmarks.closing_profile --tool-pairs 8 --budget 160 --steps 120 \
        --out benchmarks/results/closing_profile_tools
    python -m benchmarks.closing_profile --named-tools 8 --budget 160 --steps 120 \
        --out benchmarks/results/closing_profile_named
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks.budget_closing import DEFAULT_MASKBENCH, draw, drive, load_schema
from benchmarks.common import machine_info

# closing's parts: (label, owner class's module, class, method)
PARTS = (
    ("rows", "constrained.grammars.closing_matcher", "ClosingMatcher", "_narrow_own"),
    ("fresh_sorts", "constrained.grammars.closing_row_sort", "RowSorter", "sort_tokens"),
    ("sorts_again", "constrained.grammars.closing_row_sort", "RowSorter", "sorted_again"),
    ("risers", "constrained.grammars.closing_risers", "Risers", "narrow"),
    ("checks", "constrained.grammars.closing_check", "Checker", "check"),
    ("walks", "constrained.grammars.closing_check", "Checker", "_walked"),
)


class PartClock:
    """Thread CPU time and calls of each of ``PARTS`` while installed (outermost call only:
    ``_narrow_own`` calls itself)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._saved: list[tuple[type, str, Callable]] = []

    def install(self) -> None:
        import importlib

        for label, module, cls_name, name in PARTS:
            cls = getattr(importlib.import_module(module), cls_name)
            original = cls.__dict__[name]
            self._saved.append((cls, name, original))
            setattr(cls, name, self._timed(label, original))

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        self._saved = []

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def _timed(self, label: str, original: Callable) -> Callable:
        depth = [0]

        def timed(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    self.seconds[label] += time.thread_time() - start
                    self.calls[label] += 1

        return timed


def admitted(
    names: list[str], texts: dict[str, str], vocab: Any, budget: int, kind: str
) -> list[str]:
    """The ``kind`` constraints that compile and have a completion within ``budget`` (end
    included)."""
    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.closing import find_witness

    kept = []
    for name in names:
        try:
            matcher = compile_now(GrammarSpec(kind, texts[name]), vocab).matcher()
        except Exception:  # a schema no backend takes: refused at admission
            continue
        if find_witness(matcher, vocab, budget - 1) is not None:
            kept.append(name)
    return kept


def run(proc_args: tuple, names: list[str], params: Callable, vocab: Any, steps: int,
        budget: int, seed: int, clock: PartClock) -> float:  # fmt: skip
    """One batch of ``names`` for ``steps`` steps; the processor's thread CPU ms a step."""
    import torch

    from constrained.grammars.closing_sorts import forget_shared_sorts
    from constrained.processors.grammar_mask import GrammarMaskProcessor

    forget_shared_sorts()  # each run from a cold store: sharing within it only
    torch.manual_seed(seed)
    proc = GrammarMaskProcessor(*proc_args)
    proc.fill._inline_below = float("inf")  # inline: its time is this thread's
    width = proc_args[0].model_config.get_vocab_size()
    clock.reset()
    budgets = dict.fromkeys(names, budget)
    seconds, _ = drive(proc, names, params, budgets, width, vocab.eos_token_id, steps,
                       time.thread_time)  # fmt: skip
    return 1e3 * seconds / steps


def profile(model_dir: pathlib.Path, texts: dict[str, str], kind: str, budget: int,
            steps: int, rounds: int) -> dict:  # fmt: skip
    import torch
    from transformers import AutoConfig
    from vllm import SamplingParams

    from constrained.grammars import load_vocab
    from tests.simulate import fake_vllm_config

    width = AutoConfig.from_pretrained(model_dir).vocab_size
    vocab = load_vocab(str(model_dir), width)
    batch = admitted(list(texts), texts, vocab, budget, kind)
    config = fake_vllm_config(len(batch), width, model_dir)
    proc_args = (config, torch.device("cpu"), False)

    def params_for(closes: bool) -> Callable:
        def params(name: str) -> Any:
            extra = {kind: texts[name], "close_at_max_tokens": closes}
            return SamplingParams(temperature=1.0, max_tokens=budget, extra_args=extra)

        return params

    clock = PartClock()
    run(proc_args, batch, params_for(True), vocab, steps, budget, 0, clock)  # warm-up
    step: dict[str, list[float]] = {"closing": [], "off": []}
    parts: dict[str, list[float]] = {label: [] for label, *_ in PARTS}
    calls: dict[str, list[float]] = {label: [] for label, *_ in PARTS}
    clock.install()
    try:
        for r in range(rounds):
            step["closing"].append(
                run(proc_args, batch, params_for(True), vocab, steps, budget, r + 1, clock)
            )
            for label in parts:
                parts[label].append(1e3 * clock.seconds[label] / steps)
                calls[label].append(clock.calls[label] / steps)
            step["off"].append(
                run(proc_args, batch, params_for(False), vocab, steps, budget, r + 1, clock)
            )
    finally:
        clock.uninstall()
    median = {k: statistics.median(v) for k, v in step.items()}
    return {
        "kind": kind,
        "batch": len(batch),
        "budget": budget,
        "steps": steps,
        "processor_ms_per_step": median,
        "closing_ms_per_step": median["closing"] - median["off"],
        "parts_ms_per_step": {k: statistics.median(v) for k, v in parts.items()},
        "part_calls_per_step": {k: statistics.median(v) for k, v in calls.items()},
        "rounds": {"processor": step, "parts": parts},
    }


def tool_pair_tags(
    maskbench: pathlib.Path, pairs: int, seed: int, files: list[str] | None = None
) -> dict[str, str]:
    """``pairs`` structural tags, each what vLLM's hermes parser asks for when a request
    offers two Glaive tools with ``tool_choice: "required"``, as our routing moves it to the
    grammar processor (``openai_routing``: the arguments strict). vLLM's tag as it comes
    leaves every object open to more keys: a grammar that took xgrammar 4.5-5.6 s to compile
    a pair on the Intel VM, against 10 ms for the strict one. ``files``: the Glaive files
    to pair, in order (a server run's selection), instead of the first candidates."""
    from vllm.tool_parsers.structural_tag_registry import get_hermes_structural_tag
    from xgrammar.openai_tool_call_schema import FunctionToolParam

    from benchmarks.tool_calls_cold import candidates, make_tool
    from constrained.openai_routing import call_on_its_token, strict_arguments

    files = (files or candidates(maskbench, seed))[: 2 * pairs]
    tools = [FunctionToolParam.model_validate(make_tool(maskbench, f)) for f in files]
    tags = {}
    for i in range(0, len(tools) - 1, 2):
        tag = get_hermes_structural_tag(tools[i : i + 2], [], "required", False)
        tags[f"pair{i // 2}"] = strict_arguments(call_on_its_token(tag.model_dump_json()))
    return tags


def named_tool_schemas(maskbench: pathlib.Path, tools: int, seed: int) -> dict[str, str]:
    """The parameters of ``tools`` Glaive tools (``benchmarks.tool_calls_cold``'s), each what
    a named ``tool_choice`` constrains the arguments to (vLLM's structured outputs ``json``,
    which our routing moves to ``json_schema``)."""
    from benchmarks.tool_calls_cold import candidates, make_tool

    schemas = {}
    for name in candidates(maskbench, seed)[:tools]:
        schemas[name] = json.dumps(make_tool(maskbench, name)["function"]["parameters"])
    return schemas


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = record["result"]
    labels = ["processor, closing off", "processor, closing on", *result["parts_ms_per_step"]]
    values = [
        result["processor_ms_per_step"]["off"],
        result["processor_ms_per_step"]["closing"],
        *result["parts_ms_per_step"].values(),
    ]
    colours = ["#adb5bd", "#264653"] + ["#2a9d8f"] * len(result["parts_ms_per_step"])
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh(labels[::-1], values[::-1], color=colours[::-1])
    ax.set_xlabel("thread CPU ms per step (median of rounds)")
    what = "tool pairs" if result.get("kind") == "structural_tag" else "MaskBench schemas"
    ax.set_title(
        f"Closing's parts: {result['batch']} {what} at max_tokens "
        f"{result['budget']}, V1 processor alone"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--schemas", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--named-tools",
        type=int,
        default=0,
        help="profile N named tool calls' arguments instead of schemas",
    )
    parser.add_argument("--tool-pairs", type=int, default=0,
                        help="hermes `required` tags over pairs of Glaive tools")  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path("benchmarks/results/closing_profile"))  # fmt: skip
    args = parser.parse_args(argv)
    from constrained.tiny_model import build_tiny_model

    if args.tool_pairs:
        kind, texts = "structural_tag", tool_pair_tags(args.maskbench, args.tool_pairs, args.seed)
    elif args.named_tools:
        kind, texts = "json_schema", named_tool_schemas(args.maskbench, args.named_tools, args.seed)
    else:
        names = draw(args.maskbench, args.schemas, args.seed)
        kind = "json_schema"
        texts = {n: json.dumps(load_schema(args.maskbench, n)) for n in names}
    result = profile(build_tiny_model(), texts, kind, args.budget, args.steps, args.rounds)
    record = {
        "command": "python -m benchmarks.closing_profile " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "result": result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "closing_profile.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, args.out / "closing_profile.png")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
