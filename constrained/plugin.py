"""The vLLM plugin: our processors as ``vllm.logits_processors`` entry points, and the
OpenAI-server side (routing, off-loop checks, tool-tag take-over) as a ``vllm.endpoint_plugins``
entry point.

**Logits processors.** vLLM loads every class of the ``vllm.logits_processors`` entry-point
group in every engine of the environment (V1 ``_load_logitsprocs_plugins``, V2
``_load_v2_logitsprocs_plugins``), before the classes named by ``LLM(logits_processors=...)`` /
``--logits-processors``. The entry points name the classes below, one per row of
``processor_table.PROCESSORS``, each a subclass of that processor (a
``DualInterfaceProcessor``, so both loaders accept it) with the same name (engine stats key by
class name). Each goes **inert** (no slot table, no work, never applies anything) in an
engine whose ``logits_processors`` also names one of ours: code written for the flag keeps
working, in its own order and subset, and nothing is applied twice. Which options an engine
then applies, and which keys it reads, is ``engine_processors``'.

**The frontend.** ``register`` (entry point ``constrained`` of ``vllm.general_plugins``,
which vLLM calls in each of its processes before it builds an engine) has the frontend build
what its first constrained admission reads as soon as vLLM's ``InputProcessor`` is built,
while the engine core starts (``admission.warm_admission``).

**The server.** ``EndpointPlugin`` (entry point ``constrained`` of ``vllm.endpoint_plugins``;
vLLM loads it only when ``VLLM_PLUGINS`` names ``constrained``) adds our middleware
(``stream_checks.check_xargs_off_the_loop``) and turns on the routing of ``response_format``,
``structured_outputs`` and tool calls to our processors, as our launcher does.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from constrained.admission import warm_admission
from constrained.engine_processors import entry_points_active, resolve_processor
from constrained.frontend import call_after_init, flag_on_stack_names_ours
from constrained.processor_table import PROCESSORS, Processor
from constrained.request_options import nothing_to_admit

logger = logging.getLogger(__name__)

ENDPOINT_GROUP = "vllm.endpoint_plugins"
PLUGIN_NAME = "constrained"  # the name VLLM_PLUGINS must list for the server side


class EntryPoint:
    """Mixin of the entry-point classes: inert in an engine whose flag names ours."""

    inert: bool = False

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        if not entry_points_active(vllm_config):
            self.inert = True  # the flag's classes apply our options (once), or opted out
            self.vllm_config = vllm_config
            return
        super().__init__(vllm_config, *runner_args)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Admission, unless the engine's flag names ours (its classes admit the request)
        or the request has nothing for admission to look at (no frame read then)."""
        if nothing_to_admit(sampling_params):
            return
        if not flag_on_stack_names_ours(sys._getframe(1)):
            super().validate_params(sampling_params)

    def update_state(self, batch_update: Any) -> None:
        if not self.inert:
            super().update_state(batch_update)

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        return False if self.inert else super().add_request(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        if not self.inert:
            super().apply_staged_writes()

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        return logits if self.inert else super().apply(logits, ctx)


def _entry_point_class(row: Processor) -> type:
    """``row``'s processor with ``EntryPoint`` first, named as it, as this module's."""
    base = resolve_processor(row.path)
    namespace = {"__module__": __name__, "__qualname__": row.name, "__doc__": base.__doc__}
    return type(row.name, (EntryPoint, base), namespace)


# One class per processor, in application order (the entry points' order); each is a name
# of this module, as the entry points of pyproject.toml say (processor_table.entry_points).
ENTRY_POINT_CLASSES: tuple[type, ...] = tuple(_entry_point_class(row) for row in PROCESSORS)
globals().update({cls.__name__: cls for cls in ENTRY_POINT_CLASSES})


# ---- the frontend ----------------------------------------------------------------------------


def register() -> None:
    """The ``vllm.general_plugins`` entry point: warm admission's tables in each frontend.
    vLLM calls it in each of its processes, unguarded: it never raises (without it, the first
    constrained request builds the tables)."""
    try:
        call_after_init(warm_admission)
    except Exception:  # vLLM moved its InputProcessor
        logger.warning("constrained: the frontend's warm-up is off", exc_info=True)


# ---- the server ------------------------------------------------------------------------------


class EndpointPlugin:
    """vLLM's ``EndpointPlugin`` protocol: our middleware and routing on the stock server."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        from constrained.stream_checks import check_xargs_off_the_loop

        app.middleware("http")(check_xargs_off_the_loop)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        from constrained import settings as settings_module

        # Our launcher's environment, unless the user set it (admission reads it here, in
        # the API server process).
        os.environ.setdefault("CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS", "1")
        parser = getattr(args, "tool_call_parser", None)
        if parser:
            os.environ.setdefault("CONSTRAINED_TOOL_CALL_PARSER", str(parser))
        settings_module.reset()


def endpoint_plugin() -> EndpointPlugin:
    """The ``vllm.endpoint_plugins`` factory."""
    return EndpointPlugin()
