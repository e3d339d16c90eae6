"""``python -m constrained serve``: vLLM's OpenAI-compatible server with our processors.

Equivalent to::

    python -m vllm.entrypoints.openai.api_server --model DIR \\
        --logits-processors constrained.processors.logit_bias:LogitBiasProcessor ...

Our processors are appended to any ``--logits-processors`` the user gives, and our
``--middleware`` (``constrained.stream_checks``) is added so a streaming request with bad
options gets HTTP 400 too. The process is
replaced by vLLM's (``exec``), so signals and exit codes are vLLM's own.

The launcher routes OpenAI's ``response_format``, vLLM's ``structured_outputs`` and tool
calls to our processors (``constrained.openai_routing``; it sets
``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=1``); ``--no-constrained-routing`` leaves them to
vLLM's built-in structured outputs. With routing and a ``--tool-call-parser``, vLLM's
``--tool-strict-level`` defaults to ``parameter`` (every tool's arguments held to its
parameters, ``strict`` or not: vLLM's own default leaves non-strict tools' arguments free);
a ``--tool-strict-level`` given is kept.
"""

from __future__ import annotations

import os
import sys

from constrained import LOGITS_PROCESSORS

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FLAG = "--logits-processors"
# Refuses streaming requests with bad options with HTTP 400 before the stream starts.
STREAM_CHECK = "constrained.stream_checks.check_xargs_off_the_loop"
NO_ROUTING = "--no-constrained-routing"  # ours: CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=0
ROUTE_ENV = "CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS"
STRICT_LEVEL = "--tool-strict-level"


def server_argv(args: list[str]) -> list[str]:
    """vLLM server arguments with our processors merged into ``--logits-processors``."""
    user_procs: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == FLAG:
            i += 1
            while i < len(args) and not args[i].startswith("-"):
                user_procs.append(args[i])
                i += 1
            continue
        if arg.startswith(FLAG + "="):
            user_procs.extend(p for p in arg.split("=", 1)[1].split(",") if p)
        else:
            rest.append(arg)
        i += 1
    procs = user_procs + [p for p in LOGITS_PROCESSORS if p not in user_procs]
    middleware = [] if STREAM_CHECK in rest else ["--middleware", STREAM_CHECK]
    return [*rest, *middleware, FLAG, *procs]


def routed_argv(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without our routing flag, with the tool strictness routing implies; and
    whether routing is on."""
    if NO_ROUTING in args:
        return [a for a in args if a != NO_ROUTING], False
    given = any(a == STRICT_LEVEL or a.startswith(STRICT_LEVEL + "=") for a in args)
    parses_tools = any(a == "--tool-call-parser" or a.startswith("--tool-call-parser=")
                       for a in args)  # fmt: skip
    if parses_tools and not given:
        args = [*args, STRICT_LEVEL, "parameter"]
    return args, True


def main(args: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args, routing = routed_argv(args)
    os.environ[ROUTE_ENV] = "1" if routing else "0"
    argv = [sys.executable, "-m", SERVER_MODULE, *server_argv(args)]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
