"""Per decoding step: our grammar processor against vLLM's own structured-output path, the
same batch, schemas and token path, measured side by side in one run (#27: a plain
constrained row costs no more than vLLM's path).

No engine. A real ``VllmConfig`` per vLLM backend and whitespace setting (the embedded
tiny Qwen2 model, ``constrained.demo.engine_kwargs()``, logits width 151,936,
``structured_outputs_config`` with that backend), so both sides build their real objects:

- ``vllm``: a real ``StructuredOutputManager`` and ``vllm.v1.request.Request`` objects
  (``SamplingParams(structured_outputs=StructuredOutputsParams(json=...))`` checked by vLLM's
  own ``_validate_structured_outputs``, grammars from ``grammar_init``). Timed per step, what
  the engine runs for these rows: ``StructuredOutputManager.accept_tokens`` of each row's
  sampled token (``Scheduler.update_from_output``), ``Scheduler.get_grammar_bitmask`` (the
  real method on a stand-in scheduler: ``grammar_bitmask`` over the scheduled requests, its
  serial loop with the speculative/draft bookkeeping, no draft tokens), and the worker's
  ``apply_grammar_bitmask`` (reorder to the batch, xgrammar's CPU kernel) on the logits.
  vLLM's defaults (any whitespace); ``vllm_compact``: the same with
  ``disable_any_whitespace`` (the masks ours writes by default: compact JSON).
- ``ours`` / ``ours_closing``: ``GrammarMaskProcessor`` built with the same config, driven as
  V1 drives it (``update_state`` + ``apply``: advance each row's stack by its new token, the
  mask fill in its worker thread, the bitmask applied), with ``close_at_max_tokens`` off
  (the same job as vLLM's) and on (``max_tokens`` = ``--max-tokens``). Our backend is the
  one vLLM uses: ``grammar_backend`` ``xgrammar`` against vLLM's ``xgrammar``,
  ``llguidance`` against vLLM's ``guidance``; our other options at their defaults.

Schema sets: ``3field`` (one object of three required fields, ``additionalProperties``
false; four compact documents of it as the token paths, 27 to 32 tokens) and ``maskbench``
(the first ``--maskbench-count`` MaskBench schemas, shuffled with ``--seed``, that both vLLM
backends and both of ours take; each path a seeded random walk of up to ``--walk`` tokens
through the tokens all four grammars allow, then the shortest completion our xgrammar row
finds, at most ``--max-tokens - 1`` tokens; every token checked allowed by all four masks,
end-of-sequence allowed after it). Row ``i`` of a batch follows path ``i mod paths``.

A round: per batch size, each configuration (order rotated each round) gets a fresh batch
whose rows start at random offsets along their paths (the same offsets for every
configuration of the round; untimed set-up: add, compile or load, advance to the offset),
then ``--steps`` timed steps: each row takes its path's next token, fresh logits (the same
for every configuration), one step. Checked after every step (untimed): each row's next path
token survives the mask; per pair of configurations, the share of rows (first two steps of
each round) whose masked (``-inf``) set is the same. Reported: median and mean ms per step
over all rounds' steps, and the host part alone (``host_fill``; vLLM: ``accept_tokens`` +
``get_grammar_bitmask``; ours: ``update_state`` + the wait for the fill in ``apply``: what
stays on the host when the apply is a GPU kernel); ratios ours / vLLM per batch size.

    python -m benchmarks.vllm_structured_step                     # 1, 8, 64 x both sets
    python -m benchmarks.vllm_structured_step --batches 8 --rounds 1 --steps 4 \\
        --sets 3field --backends xgrammar --out /tmp/smoke          # smoke
    python -m benchmarks.vllm_structured_step --profile ours --profile-batch 64 \\
        --backends xgrammar --sets 3field                          # cProfile of one side

Writes ``vllm_structured_step.json`` and ``.png`` under ``--out``
(default ``benchmarks/results/vllm_structured_step``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from benchmarks.common import int_list, machine_info, percentile, str_list
from benchmarks.structured.schemas import DEFAULT_MASKBENCH, load_schema

# vLLM's structured-output backend -> ours (the same library underneath).
OURS_FOR = {"xgrammar": "xgrammar", "guidance": "llguidance"}
# vllm: its defaults (any whitespace); vllm_compact: disable_any_whitespace, the masks ours
# writes by default (compact JSON). ours: closing off (the same job); ours_closing: on.
VLLM_CONFIGS = ("vllm", "vllm_compact")
OURS_CONFIGS = ("ours", "ours_closing")
CONFIGS = (*VLLM_CONFIGS, *OURS_CONFIGS)

THREE_FIELDS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
    },
    "required": ["name", "age", "email"],
    "additionalProperties": False,
}
THREE_FIELD_DOCUMENTS = (
    '{"name":"Ada Augusta King, Countess of Lovelace","age":36,'
    '"email":"ada.lovelace@analytical-engine.example.org"}',
    '{"name":"Alan Mathison Turing","age":41,"email":"alan.turing@bletchley-park.example.co.uk"}',
    '{"name":"Grace Brewster Murray Hopper","age":85,"email":"grace.hopper@navy.example.mil"}',
    '{"name":"Edsger Wybe Dijkstra","age":72,"email":"ewd@cs.utexas.example.edu"}',
)


class SyncFiller:
    """Runs a started call at once (profiling: our fill thread's work seen by cProfile)."""

    def start(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def wait(self) -> None:
        pass


def source_digest() -> dict[str, str]:
    """Which ``constrained`` ran: its directory and the sha1 of its ``*.py`` files (a run from
    ``git archive COMMIT`` has no git commit of its own; compare with that commit's files)."""
    import hashlib

    import constrained

    root = pathlib.Path(constrained.__file__).parent
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return {"path": str(root), "sha1_of_py_files": digest.hexdigest()}


def vllm_config(
    model_dir: pathlib.Path, backend: str, max_num_seqs: int, compact: bool = False
) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    from constrained.demo import engine_kwargs

    kwargs = {**engine_kwargs(), "max_num_seqs": max_num_seqs}
    structured = {"backend": backend, "disable_any_whitespace": compact}
    return EngineArgs(
        model=str(model_dir), structured_outputs_config=structured, **kwargs
    ).create_engine_config()


class Paths:
    """The schemas of a set and their token paths (end-of-sequence not included)."""

    def __init__(self, name: str, schemas: list[Any], paths: list[list[int]], labels: list[str]):
        self.name = name
        self.schemas = schemas  # one per path
        self.paths = paths
        self.labels = labels


def vllm_params(schema: Any, cfg: Any, tokenizer: Any) -> Any:
    """vLLM's request, checked by its own frontend validation (which picks the backend)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = SamplingParams(
        temperature=1.0,
        max_tokens=4096,
        structured_outputs=StructuredOutputsParams(json=json.dumps(schema)),
    )
    params._validate_structured_outputs(cfg.model_config, cfg.structured_outputs_config, tokenizer)
    return params


class VllmSide:
    """vLLM's structured outputs for one backend: a real manager and real requests."""

    def __init__(self, cfg: Any) -> None:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.structured_output.utils import apply_grammar_bitmask

        self.cfg = cfg
        self.manager = StructuredOutputManager(cfg)
        self.tokenizer = self.manager.tokenizer
        # The scheduler's method on a stand-in: the real code, its two attributes.
        self.scheduler = SimpleNamespace(requests={}, structured_output_manager=self.manager)
        self.get_grammar_bitmask = Scheduler.get_grammar_bitmask
        self.apply_grammar_bitmask = apply_grammar_bitmask
        self.requests: list[Any] = []
        self.serial = 0

    def grammar(self, schema: Any) -> Any:
        """A fresh grammar of ``schema`` (for checking paths)."""
        from vllm.v1.structured_output.backend_types import StructuredOutputOptions

        params = vllm_params(schema, self.cfg, self.tokenizer)
        if self.manager.backend is None:  # built by the first grammar_init
            self.start([schema], [[]])
        return self.manager.backend.compile_grammar(
            StructuredOutputOptions.JSON, params.structured_outputs.json
        )

    def start(self, schemas: list[Any], prefixes: list[list[int]], width: int = 0) -> None:
        """A fresh batch: one request per row, its grammar ready, advanced by its prefix."""
        from vllm.v1.request import Request

        requests = []
        for schema, prefix in zip(schemas, prefixes, strict=True):
            p = vllm_params(schema, self.cfg, self.tokenizer)
            self.serial += 1
            request = Request(f"r{self.serial}", [1, 2, 3], p, None)
            self.manager.grammar_init(request)
            pending = request.structured_output_request._grammar
            if isinstance(pending, Future):
                pending.result()
            if prefix and not self.manager.accept_tokens(request, prefix):
                raise RuntimeError("vLLM's grammar refused a path prefix")
            requests.append(request)
        self.requests = requests
        self.scheduler.requests = {r.request_id: r for r in requests}
        self.ids = [r.request_id for r in requests]
        self.output = SimpleNamespace(
            has_structured_output_requests=True,
            num_scheduled_tokens={i: 1 for i in self.ids},
            scheduled_spec_decode_tokens={},
        )
        self.batch = SimpleNamespace(req_ids=list(self.ids))

    def step(self, tokens: list[int], logits: Any) -> dict[str, float]:
        start = time.perf_counter()
        for request, token in zip(self.requests, tokens, strict=True):
            if not self.manager.accept_tokens(request, [token]):
                raise RuntimeError("vLLM's grammar refused a path token")
        accepted = time.perf_counter()
        grammar_output = self.get_grammar_bitmask(self.scheduler, self.output)
        filled = time.perf_counter()
        self.apply_grammar_bitmask(self.output, grammar_output, self.batch, logits)
        applied = time.perf_counter()
        return {
            "total": applied - start,
            "accept": accepted - start,
            "fill": filled - accepted,
            "apply": applied - filled,
            "host_fill": filled - start,  # what stays on the host when the apply is a GPU kernel
        }


class OursSide:
    """Our grammar processor, V1-driven: rows added with their output so far."""

    def __init__(self, cfg: Any, backend: str, closing: bool, max_tokens: int) -> None:
        import torch

        from constrained.processors.grammar_mask import GrammarMaskProcessor

        self.proc = GrammarMaskProcessor(cfg, torch.device("cpu"), False)
        self.backend = backend
        self.closing = closing
        self.max_tokens = max_tokens
        self.outputs: list[list[int]] = []
        # Timed apart (a wrapper on the instance, the code unchanged): the wait for the fill
        # (and any row it left), before the bitmask is applied.
        self.waited = 0.0
        rows_to_mask = self.proc.fill.rows_to_mask

        def timed_rows_to_mask(*a: Any) -> Any:
            start = time.perf_counter()
            try:
                return rows_to_mask(*a)
            finally:
                self.waited += time.perf_counter() - start

        self.proc.fill.rows_to_mask = timed_rows_to_mask

    def params(self, schema: Any) -> Any:
        from vllm import SamplingParams

        extra = {
            "json_schema": schema,
            "grammar_backend": self.backend,
            "close_at_max_tokens": self.closing,
        }
        return SamplingParams(temperature=1.0, max_tokens=self.max_tokens, extra_args=extra)

    def start(self, schemas: list[Any], prefixes: list[list[int]], width: int) -> None:
        import torch
        from vllm.v1.sample.logits_processor.interface import BatchUpdate

        removed = list(range(len(self.outputs)))
        self.outputs = [list(p) for p in prefixes]
        added = [
            (i, self.params(s), [1, 2, 3], out)
            for i, (s, out) in enumerate(zip(schemas, self.outputs, strict=True))
        ]
        update = BatchUpdate(batch_size=len(added), removed=removed, added=added, moved=[])
        self.proc.update_state(update)  # untimed: compile or load, advance to the offsets
        self.proc.apply(torch.zeros(len(added), width))

    def step(self, tokens: list[int], logits: Any) -> dict[str, float]:
        for out, token in zip(self.outputs, tokens, strict=True):
            out.append(token)  # the engine's append (V1's live output lists)
        self.waited = 0.0
        start = time.perf_counter()
        self.proc.update_state(None)
        updated = time.perf_counter()
        self.proc.apply(logits)
        applied = time.perf_counter()
        return {
            "total": applied - start,
            "update_state": updated - start,
            "fill_wait": self.waited,
            "apply_bitmask": applied - updated - self.waited,
            # advance + fill (+ the thread handoff): what stays on the host on a GPU
            "host_fill": updated - start + self.waited,
        }


class _VllmGrammar:
    """A vLLM grammar as the two calls the walk makes of a matcher."""

    def __init__(self, grammar: Any) -> None:
        self.grammar = grammar

    def fill(self, bitmask: Any, row: int) -> None:
        self.grammar.fill_bitmask(bitmask, row)

    def consume(self, tokens: list[int]) -> bool:
        return self.grammar.accept_tokens("walk", tokens)


def walk_path(
    schema: Any, vocab: Any, sides: dict[str, VllmSide], steps: int, rng: random.Random, limit: int
) -> list[int]:
    """A seeded random walk of ``steps`` tokens through the tokens every grammar allows
    (vLLM's backends and ours; never end-of-sequence), then the shortest completion our
    xgrammar row finds from there; [] when longer than ``limit``."""
    import numpy as np
    import torch

    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.closing import allowed_ids, find_witness
    from constrained.grammars.matcher import words_for

    text = json.dumps(schema)
    grammars: list[Any] = []
    for backend, side in sides.items():
        grammars.append(_VllmGrammar(side.grammar(schema)))
        grammars.append(compile_now(GrammarSpec("json_schema", text, OURS_FOR[backend]), vocab))
        grammars[-1] = grammars[-1].matcher()
    ours = compile_now(GrammarSpec("json_schema", text, "xgrammar"), vocab).matcher()
    grammars.append(ours)
    bitmask = torch.zeros(len(grammars), words_for(vocab.width), dtype=torch.int32)
    path: list[int] = []
    for _ in range(steps):
        if ours.accepts_end():
            break
        for row, grammar in enumerate(grammars):
            grammar.fill(bitmask, row)
        both = bitmask[0].clone()
        for row in range(1, len(grammars)):
            both &= bitmask[row]
        allowed = np.flatnonzero(allowed_ids(both, vocab.width))
        allowed = allowed[allowed != vocab.eos_token_id]
        if not allowed.size:
            break
        token = int(allowed[rng.randrange(allowed.size)])
        if not all(g.consume([token]) for g in grammars):
            return []
        path.append(token)
    rest = find_witness(ours, vocab, limit - len(path))
    return path + rest if rest is not None and len(path) + len(rest) <= limit else []


def accepted_by_all(path: list[int], schema: Any, vocab: Any, sides: dict[str, VllmSide]) -> str:
    """'' when every grammar (vLLM's backends and ours) allows each path token in its mask,
    takes it, and then allows end-of-sequence; else which one refused, and where."""
    import torch

    from constrained.grammars import GrammarSpec, compile_now
    from constrained.grammars.matcher import words_for

    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)

    def allowed(token: int) -> bool:
        return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)

    for backend, side in sides.items():
        grammar = side.grammar(schema)
        ours = OURS_FOR[backend]
        matcher = compile_now(GrammarSpec("json_schema", json.dumps(schema), ours), vocab).matcher()
        for i, token in enumerate([*path, vocab.eos_token_id]):
            grammar.fill_bitmask(bitmask, 0)
            if not allowed(token):
                return f"vllm {backend}'s mask at token {i}"
            if i < len(path) and not grammar.accept_tokens("check", [token]):
                return f"vllm {backend} at token {i}"
            matcher.fill(bitmask, 0)
            if not allowed(token):
                return f"ours {ours}'s mask at token {i}"
            if i < len(path) and not matcher.consume([token]):
                return f"ours {ours} at token {i}"
    return ""


def three_field_paths(vocab: Any) -> Paths:
    encode = vocab.hf_tokenizer.encode
    paths = [list(encode(doc, add_special_tokens=False)) for doc in THREE_FIELD_DOCUMENTS]
    labels = [f"doc{i}" for i in range(len(paths))]
    return Paths("3field", [THREE_FIELDS] * len(paths), paths, labels)


def maskbench_paths(args: argparse.Namespace, vocab: Any, sides: dict[str, VllmSide]) -> Paths:
    names = sorted(p.name for p in args.maskbench.glob("*.json"))
    rng = random.Random(args.seed)
    rng.shuffle(names)
    chosen: list[tuple[str, Any, list[int]]] = []
    skipped: dict[str, str] = {}
    for name in names:
        if len(chosen) == args.maskbench_count:
            break
        schema = load_schema(args.maskbench, name)
        rng = random.Random(name)
        walk, refused = args.walk, "no path"
        try:
            while refused and walk >= 0:  # a shorter walk if the completion leaves a grammar
                path = walk_path(schema, vocab, sides, walk, rng, args.max_tokens - 1)
                if len(path) < args.steps + 1:
                    refused = f"a path of {len(path)} tokens (needs {args.steps + 1} or more)"
                else:
                    refused = accepted_by_all(path, schema, vocab, sides)
                walk = walk // 2 if walk > 1 else -1
        except Exception as exc:
            refused = f"refused: {str(exc).splitlines()[0][:120] if str(exc) else repr(exc)}"
        if refused:
            skipped[name] = refused
            continue
        chosen.append((name, schema, path))
    args.skipped = skipped
    return Paths(
        "maskbench",
        [s for _, s, _ in chosen],
        [p for _, _, p in chosen],
        [n for n, _, _ in chosen],
    )


def masked_rows_equal(a: Any, b: Any) -> int:
    import torch

    return int((torch.isinf(a) == torch.isinf(b)).all(dim=1).sum())


def run_cell(
    args: argparse.Namespace,
    paths: Paths,
    batch: int,
    sides: dict[str, Any],
    width: int,
    rounds: int,
    profile: str | None = None,
) -> dict:
    """All rounds of one (backend, schema set, batch size): per configuration, step times."""
    import torch

    times: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    path_misses = {c: 0 for c in CONFIGS}
    pairs = [(a, b) for a in CONFIGS for b in CONFIGS if a < b]
    same_rows, compared = {pair: 0 for pair in pairs}, 0
    rows = [i % len(paths.paths) for i in range(batch)]
    for r in range(rounds):
        rng = random.Random(1000 * r + batch)
        offsets = [rng.randint(0, len(paths.paths[p]) - args.steps) for p in rows]
        gen = torch.Generator().manual_seed(r)
        logits = [torch.randn(batch, width, generator=gen) * 2 for _ in range(min(args.steps, 4))]
        order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
        if profile is not None:
            order = (profile,)
        masked: dict[str, list[Any]] = {}
        for config in order:
            prefixes = [paths.paths[p][:o] for p, o in zip(rows, offsets, strict=True)]
            schemas = [paths.schemas[p] for p in rows]
            side = sides[config]
            side.start(schemas, prefixes, width)
            masked[config] = []
            profiler = args.profiler if profile == config else None
            for t in range(args.steps):
                tokens = [paths.paths[p][o + t] for p, o in zip(rows, offsets, strict=True)]
                out = logits[t % len(logits)].clone()
                if profiler is not None:
                    profiler.enable()
                times[config].append(side.step(tokens, out))
                if profiler is not None:
                    profiler.disable()
                if profiler is None and t + 1 < args.steps:
                    nxt = [paths.paths[p][o + t + 1] for p, o in zip(rows, offsets, strict=True)]
                    path_misses[config] += int(torch.isinf(out[range(batch), nxt]).sum())
                masked[config].append(out if t < 2 else None)  # two steps compared
        for a, b in pairs:
            if a in masked and b in masked:
                for t in range(min(2, args.steps)):
                    same_rows[a, b] += masked_rows_equal(masked[a][t], masked[b][t])
        compared += batch * min(2, args.steps)
    summary: dict[str, Any] = {}
    for config, steps in times.items():
        if not steps:
            continue
        parts = {k: [s[k] * 1000 for s in steps] for k in steps[0]}
        summary[config] = {
            "steps": len(steps),
            "median_ms": statistics.median(parts["total"]),
            "mean_ms": statistics.fmean(parts["total"]),
            "p90_ms": percentile(parts["total"], 90),
            "min_ms": min(parts["total"]),
            "per_row_us": 1000 * statistics.median(parts["total"]) / batch,
            "components_median_ms": {
                k: statistics.median(v) for k, v in parts.items() if k != "total"
            },
            "path_tokens_masked": path_misses[config],
        }
    ratios = {
        f"{c}/{v}": summary[c]["median_ms"] / summary[v]["median_ms"]
        for c in OURS_CONFIGS
        for v in VLLM_CONFIGS
        if c in summary and v in summary
    }
    ratios.update(
        {
            f"{c}/{v} mean": summary[c]["mean_ms"] / summary[v]["mean_ms"]
            for c in OURS_CONFIGS
            for v in VLLM_CONFIGS
            if c in summary and v in summary
        }
    )
    fill = {c: r["components_median_ms"]["host_fill"] for c, r in summary.items()}
    ratios.update(
        {
            f"{c}/{v} host_fill": fill[c] / fill[v]
            for c in OURS_CONFIGS
            for v in VLLM_CONFIGS
            if c in fill and v in fill
        }
    )
    return {
        "batch": batch,
        "results": summary,
        "ratios": ratios,
        # rows (of the first two steps of each round) whose -inf set is the same in both
        "same_masked_set_share": {
            f"{a}~{b}": n / compared for (a, b), n in same_rows.items() if times[a] and times[b]
        },
    }


def print_profile(profiler: Any, steps: int, batch: int, top: int = 25) -> None:
    """The functions with the most time, in ms per step and us per row and step."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, calls, own, cumulative, _) in stats.items():
        where = f"{pathlib.Path(file).name}:{line}({func})" if line else func
        rows.append((where, calls / steps, 1000 * own / steps, 1000 * cumulative / steps))
    for key, title in ((3, "cumulative"), (2, "own time")):
        print(f"-- by {title}: calls/step, own ms/step, cumulative ms/step, cumulative us/row")
        for where, calls, own, cumulative in sorted(rows, key=lambda r: -r[key])[:top]:
            per_row = 1000 * cumulative / batch
            print(f"{calls:9.1f} {own:9.3f} {cumulative:9.3f} {per_row:9.1f}  {where}")


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = record["cells"]
    keys = sorted({(c["backend"], c["set"]) for c in panels})
    cols = min(2, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, grid = plt.subplots(rows, cols, figsize=(6 * cols, 3.8 * rows), squeeze=False)
    axes = grid.flatten()
    colours = {
        "vllm": "#6c757d",
        "vllm_compact": "#adb5bd",
        "ours": "#2a9d8f",
        "ours_closing": "#e9c46a",
    }
    for ax, (backend, name) in zip(axes, keys, strict=False):
        cells = [c for c in panels if c["backend"] == backend and c["set"] == name]
        xs = range(len(cells))
        width = 0.2
        for k, config in enumerate(CONFIGS):
            values = [c["results"][config]["median_ms"] for c in cells]
            ax.bar(
                [x + (k - 1.5) * width for x in xs],
                values,
                width,
                color=colours[config],
                label=config,
            )
        for x, c in zip(xs, cells, strict=True):
            top = max(c["results"][k]["median_ms"] for k in CONFIGS)
            label = f"{c['ratios']['ours/vllm']:.2f}x"
            ax.text(x, top * 1.15, label, ha="center", fontsize=8)
        ax.set_xticks(list(xs), [f"B={c['batch']}" for c in cells])
        ax.set_yscale("log")
        low = min(c["results"][k]["median_ms"] for c in cells for k in CONFIGS)
        high = max(c["results"][k]["median_ms"] for c in cells for k in CONFIGS)
        ax.set_ylim(low / 3, high * 2)
        ax.set_title(f"vLLM {backend} / ours {OURS_FOR[backend]}: {name}", fontsize=9)
    for ax in axes[::cols]:
        ax.set_ylabel("ms per step (median)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Grammar work per decoding step (label: ours / vllm, closing off)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int_list, default=[1, 8, 64])
    parser.add_argument("--backends", type=str_list, default=["xgrammar", "guidance"])
    parser.add_argument("--sets", type=str_list, default=["3field", "maskbench"])
    parser.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    parser.add_argument("--maskbench-count", type=int, default=8)
    parser.add_argument("--walk", type=int, default=24, help="random tokens before completing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=16, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64, help="ours_closing's budget")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--profile", choices=CONFIGS, default=None)
    parser.add_argument("--profile-batch", type=int, default=64)
    parser.add_argument("--out", default="benchmarks/results/vllm_structured_step")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch
    from transformers import AutoConfig

    from constrained.grammars import load_vocab
    from constrained.tiny_model import build_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = build_tiny_model()
    width = AutoConfig.from_pretrained(model_dir).vocab_size
    vocab = load_vocab(str(model_dir), width)
    capacity = max(max(args.batches), args.profile_batch if args.profile else 1)
    configs = {b: vllm_config(model_dir, b, capacity) for b in args.backends}
    checkers = {b: VllmSide(configs[b]) for b in args.backends}  # also vLLM's timed side
    args.profiler, args.skipped = None, {}
    sets = {}
    if "3field" in args.sets:
        sets["3field"] = three_field_paths(vocab)
        for path, schema in zip(sets["3field"].paths, sets["3field"].schemas, strict=True):
            refused = accepted_by_all(path, schema, vocab, checkers)
            if refused:
                raise SystemExit(f"a 3field document refused by {refused}")
    if "maskbench" in args.sets:
        sets["maskbench"] = maskbench_paths(args, vocab, checkers)
    cells = []
    for backend in args.backends:
        ours = OURS_FOR[backend]
        sides: dict[str, Any] = {
            "vllm": checkers[backend],
            "vllm_compact": VllmSide(vllm_config(model_dir, backend, capacity, compact=True)),
            "ours": OursSide(configs[backend], ours, False, args.max_tokens),
            "ours_closing": OursSide(configs[backend], ours, True, args.max_tokens),
        }
        if args.profile:
            import cProfile

            for config in OURS_CONFIGS:
                sides[config].proc.fill.filler = SyncFiller()  # inline: seen by cProfile
            for name, paths in sets.items():
                run_cell(args, paths, args.profile_batch, sides, width, 1)  # warm-up
                args.profiler = cProfile.Profile()
                cell = run_cell(
                    args, paths, args.profile_batch, sides, width, args.rounds, args.profile
                )
                result = cell["results"][args.profile]
                print(
                    f"== {backend} {name} {args.profile} B={args.profile_batch}: "
                    f"{result['median_ms']:.3f} ms per step (median, under cProfile)"
                )
                print_profile(args.profiler, result["steps"], args.profile_batch)
            continue
        for name, paths in sets.items():
            run_cell(args, paths, min(args.batches), sides, width, 1)  # warm-up: compiles
            for batch in args.batches:
                cell = run_cell(args, paths, batch, sides, width, args.rounds)
                cell.update(backend=backend, ours_backend=ours, set=name)
                cells.append(cell)
                print(
                    json.dumps(
                        {
                            "backend": backend,
                            "set": name,
                            "batch": batch,
                            "ms": {c: round(v["median_ms"], 3) for c, v in cell["results"].items()},
                            "ratio": {c: round(v, 3) for c, v in cell["ratios"].items()},
                        }
                    ),
                    flush=True,
                )
    if args.profile:
        return 0
    record = {
        "benchmark": "vllm_structured_step",
        "command": "python -m benchmarks.vllm_structured_step " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "source": source_digest(),
        "settings": {
            "batches": args.batches,
            "backends": {b: OURS_FOR[b] for b in args.backends},
            "steps": args.steps,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "logits_width": width,
            "model": str(model_dir),
            "seed": args.seed,
            "walk": args.walk,
        },
        "sets": {
            name: {
                "labels": p.labels,
                "path_tokens": [len(x) for x in p.paths],
                "schemas": p.schemas if name == "3field" else None,
            }
            for name, p in sets.items()
        },
        "maskbench_skipped": args.skipped,
        "cells": cells,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_structured_step.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out / "vllm_structured_step.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
