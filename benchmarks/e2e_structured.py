"""End-to-end JSON-schema generation: ours vs vLLM's built-in, and validity across MaskBench.

Two subcommands, both on the embedded tiny Qwen2 model (random weights, so its text is noise:
the constraint alone has to make the output valid) with ``constrained.demo.engine_kwargs()``:

``throughput``
    The same MaskBench schemas and prompts (one schema per request, a batch of ``--batch``
    requests in one ``llm.generate`` call), temperature 1.0, a seed per request, in these
    configurations, each in its own child process (one engine each), alternated over
    ``--rounds`` rounds so machine noise hits all of them:

    - ``none``: no constraint (reference; plain engine, nothing registered);
    - ``ours``: ``extra_args={"json_schema": ...}`` (our processors, ``grammar_backend``
      auto, compact whitespace);
    - ``ours_strict``: the same plus ``"disable_additional_properties": True`` (objects whose
      schema is silent about extra keys get none, as xgrammar's strict mode that vLLM uses);
    - ``ours_xgrammar``: ``ours_strict`` with ``"grammar_backend": "xgrammar"``, vLLM's backend;
    - ``vllm``: vLLM's ``StructuredOutputsParams(json=...)``, engine started with
      ``structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True}``;
    - ``vllm_ws``: the same with vLLM's default whitespace (``disable_any_whitespace`` off).

    The schemas are drawn with a fixed seed from all of MaskBench, keeping those that both
    vLLM's xgrammar backend (its admission check and a compile) and our admission (option
    parsing and the compile) of each of our configurations in ``--configs`` accept. Writes
    ``e2e_structured.json`` and ``.png``. With ``--restarted``, each engine starts from the
    store an earlier engine of its configuration left after one constrained request (a
    restarted server: the tokenizer's record kept, every timed schema still new).

``validity``
    A stratified sample of MaskBench (``--per-split`` schemas from each split, by file-name
    prefix), each submitted alone first (the real admission: a refused schema raises at
    ``generate``), then every admitted one generated in one batched ``generate`` call with
    ``--max-tokens``. Every output that finishes with ``stop`` is parsed and validated with
    ``jsonschema`` (the schema's own draft, default 2020-12, with its format checker).
    Writes ``generation_validity.json``.

Usage::

    python -m benchmarks.e2e_structured throughput                 # 3 rounds x 5 configs
    python -m benchmarks.e2e_structured throughput --batch 8 --tokens 16 --rounds 1 \\
        --configs none,ours,vllm --out /tmp/smoke                  # smoke test
    python -m benchmarks.e2e_structured throughput --batch 64 --tokens 160 --warmup-tokens \\
        160 --rounds 2 --configs ours_strict,vllm --restarted     # cold call, restarted server
    python -m benchmarks.e2e_structured validity                   # 15 splits x 20 schemas
    python -m benchmarks.e2e_structured validity --per-split 1 --max-tokens 64 --out /tmp/smoke

The work is done in ``benchmarks/structured/`` (its ``__init__`` lists the modules); this file
is the command line only, including the hidden ``_select`` and ``_run`` subcommands the
``throughput`` parent starts its children with.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from benchmarks.common import str_list
from benchmarks.structured.configs import CONFIGS
from benchmarks.structured.outcomes import check_output
from benchmarks.structured.report import write_json
from benchmarks.structured.schemas import DEFAULT_MASKBENCH
from benchmarks.structured.selection import run_select
from benchmarks.structured.throughput import run_throughput
from benchmarks.structured.timed_run import prime_store, run_throughput_child
from benchmarks.structured.validity import run_validity

# check_output: benchmarks/soak.py judges its outputs with it, imported from here.
__all__ = ["check_output", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The subcommands ``throughput`` and ``validity``, and the children's ``_select``/``_run``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
        p.add_argument("--out", default="benchmarks/results", help="results directory")

    tp = sub.add_parser("throughput", help="ours vs vLLM's built-in structured outputs")
    common(tp)
    tp.add_argument("--batch", type=int, default=64, help="schemas = requests per generate")
    tp.add_argument("--tokens", type=int, default=128, help="max_tokens per request")
    tp.add_argument("--warmup-tokens", type=int, default=8, help="max_tokens of the cold call")
    tp.add_argument("--rounds", type=int, default=3, help="alternated rounds (median kept)")
    tp.add_argument("--configs", type=str_list, default=list(CONFIGS), help=",".join(CONFIGS))
    tp.add_argument("--seed", type=int, default=0, help="seed of the schema selection")
    tp.add_argument(
        "--compile-timeout", type=float, default=10.0, help="selection: seconds per compile"
    )
    tp.add_argument(
        "--restarted",
        action="store_true",
        help="each engine starts where an earlier one of its configuration served one "
        "constrained request and stopped (a restarted server: the store keeps the tokenizer's "
        "record; every timed schema is still new)",
    )
    tp.add_argument(
        "--profile-dir",
        metavar="DIR",
        help="cProfile the round-0 timed call of our configs (frontend process only: admission "
        "and output handling; the processors run in the engine's worker) into DIR/*.prof",
    )

    va = sub.add_parser("validity", help="validity of our outputs across MaskBench splits")
    common(va)
    va.add_argument("--per-split", type=int, default=20, help="schemas drawn per split")
    va.add_argument("--max-tokens", type=int, default=512)
    va.add_argument(
        "--close-bias",
        type=float,
        default=0.0,
        help="add this logit_bias (ours) to single tokens that close JSON strings, objects "
        "and arrays, so more outputs finish (writes generation_validity_biased.json)",
    )
    va.add_argument("--seed", type=int, default=0, help="seed of the per-split sample")
    va.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "llguidance", "xgrammar", "outlines"],
        help="grammar_backend",
    )

    sel = sub.add_parser("_select", help=argparse.SUPPRESS)
    sel.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    sel.add_argument("--batch", type=int, required=True)
    sel.add_argument("--seed", type=int, required=True)
    sel.add_argument("--compile-timeout", type=float, required=True)
    sel.add_argument("--child-out", required=True)
    sel.add_argument("--ours", type=str_list, default=["ours"], help="our configs that must admit")

    prime = sub.add_parser("_prime", help=argparse.SUPPRESS)
    prime.add_argument("config", choices=CONFIGS)
    prime.add_argument("--child-out", required=True)

    run = sub.add_parser("_run", help=argparse.SUPPRESS)
    run.add_argument("config", choices=CONFIGS)
    run.add_argument("--files", required=True)
    run.add_argument("--maskbench", type=pathlib.Path, default=DEFAULT_MASKBENCH)
    run.add_argument("--tokens", type=int, required=True)
    run.add_argument("--warmup-tokens", type=int, required=True)
    run.add_argument("--profile", type=pathlib.Path)
    run.add_argument("--child-out", required=True)

    args = parser.parse_args(argv)
    if args.command == "throughput":
        unknown = [c for c in args.configs if c not in CONFIGS]
        if unknown:
            parser.error(f"unknown config(s) {unknown}; choose from {list(CONFIGS)}")
        if args.batch > 64:
            parser.error("--batch must be <= max_num_seqs = 64 (constrained.demo.engine_kwargs)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand; the children write their record to ``--child-out``."""
    args = parse_args(argv)
    if args.command == "_select":
        record = run_select(args.maskbench, args.batch, args.seed, args.compile_timeout, args.ours)
        write_json(pathlib.Path(args.child_out), record)
        sys.stdout.flush()
        os._exit(0)  # a compile that timed out may still run in a worker thread
    if args.command == "_run":
        files = json.loads(pathlib.Path(args.files).read_text())
        record = run_throughput_child(
            args.config, files, args.maskbench, args.tokens, args.warmup_tokens, args.profile
        )
        write_json(pathlib.Path(args.child_out), record)
        return 0
    if args.command == "_prime":
        write_json(pathlib.Path(args.child_out), prime_store(args.config))
        return 0
    if args.command == "throughput":
        return run_throughput(args)
    return run_validity(args)


if __name__ == "__main__":
    sys.exit(main())
