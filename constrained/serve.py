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
TOOL_PARSER = "--tool-call-parser"
TOOL_PARSER_ENV = "CONSTRAINED_TOOL_CALL_PARSER"


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


def flag_value(args: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag V`` or ``--flag=V``), if any."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def routed_argv(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``args`` without our routing flag, with the tool strictness routing implies, and the
    environment our processes read it from."""
    if NO_ROUTING in args:
        return [a for a in args if a != NO_ROUTING], {ROUTE_ENV: "0"}
    env = {ROUTE_ENV: "1"}
    parser = flag_value(args, TOOL_PARSER)
    if parser:
        env[TOOL_PARSER_ENV] = parser
        if flag_value(args, STRICT_LEVEL) is None:
            args = [*args, STRICT_LEVEL, "parameter"]
    return args, env


def main(args: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args, env = routed_argv(args)
    os.environ.update(env)
    argv = [sys.executable, "-m", SERVER_MODULE, *server_argv(args)]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
