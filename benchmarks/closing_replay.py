"""Closing's cost on a stock server's own tool calls, replayed without the server (#55).

The server benchmark (``tool_calls_cold --shapes required``) ranges widely between servers
of one code on a 2-core machine, so a change to closing of a few percent is not told apart
there. This one takes what such a pass samples and replays it through the grammar
processor alone:

- ``record``: an offline engine (``LLM.chat``, the tiny model, 8 sequences at a time as
  the benchmark's 8 clients) answers the ``required`` requests of ``--pairs`` pairs of
  Glaive tools (``--selection``: a server run's ``tool_calls_cold.json``, its tools),
  each with the tag vLLM's hermes parser builds as our routing passes it on
  (``benchmarks.closing_profile.tool_pair_tags``), the same seeds, ``max_tokens`` 160.
  Writes ``outputs.json``: each request's tag and output token ids.
- ``replay``: the V1 grammar processor (inline fill) is driven as the engine drove it, 8
  rows at a time, each row's next token the recorded one (it must be allowed), closing on
  and off in turn over ``--rounds`` rounds. Reported: the processor's thread CPU ms a pass
  (``update_state`` + ``apply``), closing's share (on less off), and a digest of every
  allowed-token row with closing on: two checkouts that print the same digest narrowed
  every row alike. Writes ``closing_replay.json`` and ``closing_replay.png``.

    python -m benchmarks.closing_replay record --out /tmp/replay \\
        --selection benchmarks/results/tool_calls_cold_1206_replay/tool_calls_cold.json
    python -m benchmarks.closing_replay replay --outputs /tmp/replay/outputs.json \\
        --out /tmp/replay
    # an A/B: the same outputs.json replayed from each checkout, alternately

On a shared machine run ``record`` under ``flock /tmp/engine.lock`` (one engine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

from benchmarks.common import machine_info

BUDGET = 160  # the server benchmark's max_tokens
ROWS = 8  # its concurrent clients
FIRST_SEED = 1000  # its first pass's request seeds (``tool_calls_cold``: request_seed)


def record(
    maskbench: pathlib.Path, pairs: int, seed: int, out: pathlib.Path, files: list[str] | None
) -> dict[str, Any]:
    """Run the offline engine over ``pairs`` tool pairs (of ``files``, a server run's
    selection, else the first candidates); write and return ``outputs.json``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from benchmarks.closing_profile import tool_pair_tags
    from benchmarks.tool_calls_cold import candidates, make_tool
    from constrained.demo import engine_kwargs
    from constrained.tiny_model import build_tiny_model

    tags = list(tool_pair_tags(maskbench, pairs, seed, files).values())
    files = (files or candidates(maskbench, seed))[: 2 * len(tags)]
    tools = [make_tool(maskbench, f) for f in files]
    llm = LLM(model=str(build_tiny_model()), **{**engine_kwargs(), "max_num_seqs": ROWS})
    conversations, params = [], []
    for i, tag in enumerate(tags):
        names = " or ".join(t["function"]["name"] for t in tools[2 * i : 2 * i + 2])
        conversations.append([{"role": "user", "content": f"Call {names}."}])
        params.append(
            SamplingParams(temperature=1.0, seed=FIRST_SEED + i, max_tokens=BUDGET,
                           extra_args={"structural_tag": tag})
        )  # fmt: skip
    start = time.perf_counter()
    outputs = llm.chat(conversations, params, tools=tools, use_tqdm=False)
    recorded = {
        "command": "python -m benchmarks.closing_replay " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "engine_wall_s": time.perf_counter() - start,
        "tags": tags,
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outputs],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "outputs.json").write_text(json.dumps(recorded) + "\n")
    return recorded


def replay_once(tags: list[str], outputs: list[list[int]], closes: bool) -> dict[str, Any]:
    """One pass: every output forced through the processor, ``ROWS`` rows at a time."""
    import torch
    from transformers import AutoConfig
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from constrained.grammars import load_vocab
    from constrained.grammars.closing_sorts import forget_shared_sorts
    from constrained.processors.grammar_mask import GrammarMaskProcessor
    from constrained.tiny_model import build_tiny_model
    from tests.simulate import fake_vllm_config

    model = build_tiny_model()
    width = AutoConfig.from_pretrained(model).vocab_size
    eos = load_vocab(str(model), width).eos_token_id
    forget_shared_sorts()  # each pass from a cold store, as a server's first
    proc = GrammarMaskProcessor(fake_vllm_config(ROWS, width, model), torch.device("cpu"), False)
    proc.fill._inline_below = float("inf")  # inline: its time is this thread's

    def params(i: int) -> SamplingParams:
        extra = {"structural_tag": tags[i], "close_at_max_tokens": closes}
        return SamplingParams(temperature=1.0, max_tokens=BUDGET, extra_args=extra)

    queue = list(range(len(tags)))
    rows: list[tuple[int, list[int]] | None] = [None] * ROWS
    added = []
    for r in range(min(ROWS, len(queue))):
        i = queue.pop(0)
        rows[r] = (i, [])
        added.append((r, params(i), [1, 2, 3], rows[r][1]))
    update: Any = BatchUpdate(batch_size=ROWS, removed=[], added=added, moved=[])
    digest, seconds, steps = hashlib.sha256(), 0.0, 0
    while any(row is not None for row in rows):
        logits = torch.zeros(ROWS, width)
        start = time.thread_time()
        proc.update_state(update)
        allowed = torch.isfinite(proc.apply(logits))
        seconds += time.thread_time() - start
        steps += 1
        added, removed = [], []
        for r, row in enumerate(rows):
            if row is None:
                continue
            i, output = row
            token = outputs[i][len(output)]
            if closes:
                digest.update(allowed[r].numpy().tobytes())
                if not allowed[r, token]:  # another code narrowed this row otherwise
                    raise SystemExit(f"request {i}: token {token} at {len(output)} not allowed")
            output.append(token)
            if len(output) < len(outputs[i]) and token != eos:
                continue
            if queue:
                j = queue.pop(0)
                rows[r] = (j, [])
                added.append((r, params(j), [1, 2, 3], rows[r][1]))
            else:
                rows[r] = None
                removed.append(r)
        changed = added or removed
        update = BatchUpdate(ROWS, removed=removed, added=added, moved=[]) if changed else None
    return {"ms": 1e3 * seconds, "steps": steps, "digest": digest.hexdigest()[:16]}


def replay(recorded: dict[str, Any], rounds: int) -> dict[str, Any]:
    """``rounds`` passes with closing on and off in turn, after one warm-up (compiles)."""
    tags, outputs = recorded["tags"], recorded["outputs"]
    replay_once(tags, outputs, True)
    runs: dict[str, list[dict[str, Any]]] = {"closing": [], "off": []}
    for _ in range(rounds):
        runs["closing"].append(replay_once(tags, outputs, True))
        runs["off"].append(replay_once(tags, outputs, False))
    digests = {run["digest"] for run in runs["closing"]}
    if len(digests) != 1:
        raise SystemExit(f"closing's rows differ between passes of one code: {digests}")
    on = statistics.median(run["ms"] for run in runs["closing"])
    off = statistics.median(run["ms"] for run in runs["off"])
    return {
        "requests": len(tags),
        "tokens": sum(len(o) for o in outputs),
        "steps": runs["closing"][0]["steps"],
        "digest": digests.pop(),
        "ms_per_pass": {"closing": on, "off": off},
        "closing_ms_per_pass": on - off,
        "rounds": {k: [run["ms"] for run in v] for k, v in runs.items()},
    }


def plot(record: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = record["result"]["rounds"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    bars = (("closing", "closing on", "#ff7f0e"), ("off", "closing off", "#1f77b4"))
    for offset, (config, label, colour) in enumerate(bars):
        xs = [i + 0.4 * offset for i in range(len(rounds[config]))]
        ax.bar(xs, rounds[config], width=0.4, color=colour, label=label)
    ax.set_xticks([i + 0.2 for i in range(len(rounds["closing"]))])
    ax.set_xticklabels([f"round {i + 1}" for i in range(len(rounds["closing"]))])
    ax.set_ylabel("processor CPU ms a pass")
    ax.legend(fontsize=8)
    result = record["result"]
    ax.set_title(f"{result['requests']} required tool calls replayed ({result['tokens']} tokens)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.structured.schemas import DEFAULT_MASKBENCH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("record", "replay"))
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--selection", type=pathlib.Path,
                        help="record: a tool_calls_cold.json whose tools to pair")  # fmt: skip
    parser.add_argument("--outputs", type=pathlib.Path, help="replay: a record's outputs.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/closing_replay"))
    args = parser.parse_args(argv)
    if args.action == "record":
        files = None
        if args.selection:
            files = json.loads(args.selection.read_text())["selection"]["files"]
        recorded = record(args.maskbench, args.pairs, args.seed, args.out, files)
        reasons = recorded["finish_reasons"]
        print(json.dumps({"requests": len(reasons), "stop": reasons.count("stop")}))
        return 0
    recorded = json.loads((args.outputs or args.out / "outputs.json").read_text())
    record_ = {
        "command": "python -m benchmarks.closing_replay " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "result": replay(recorded, args.rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "closing_replay.json").write_text(json.dumps(record_, indent=1) + "\n")
    plot(record_, args.out / "closing_replay.png")
    print(json.dumps({k: v for k, v in record_["result"].items() if k != "rounds"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
