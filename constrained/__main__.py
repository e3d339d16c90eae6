"""Command line: ``constrained {tiny-model,serve,demo}`` (or ``python -m constrained``)."""

from __future__ import annotations

import argparse
import sys

from constrained import __version__, serve, tiny_model


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="constrained", description=__doc__)
    parser.add_argument("--version", action="version", version=f"constrained {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("tiny-model", help="build (or reuse) the embedded default model")
    tiny_model.add_arguments(build)

    commands.add_parser(
        "serve",
        help="vLLM's OpenAI-compatible server with our processors registered",
        description="Every argument is passed to vLLM's api_server (e.g. --model DIR --port N).",
        add_help=False,
    )

    demo = commands.add_parser("demo", help="generate with and without our options, and compare")
    demo.add_argument("--model", help="model directory (default: the embedded tiny model)")

    # serve takes vLLM's own flags verbatim; do not let argparse see them.
    if argv[:1] == ["serve"]:
        serve.main(argv[1:])
        return
    args = parser.parse_args(argv)
    if args.command == "tiny-model":
        tiny_model.main(args)
    elif args.command == "demo":
        from constrained import demo as demo_module  # imports vLLM: only when asked

        demo_module.main(args.model)


if __name__ == "__main__":
    main()
