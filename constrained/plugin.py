"""The vLLM plugin: our processors as ``vllm.logits_processors`` entry points, and the
OpenAI-server side (routing, off-loop checks, tool-tag take-over) as a ``vllm.endpoint_plugins``
entry point.

**Logits processors.** vLLM loads every class of the ``vllm.logits_processors`` entry-point
group in every engine of the environment (V1 ``_load_logitsprocs_plugins``, V2
``_load_v2_logitsprocs_plugins``), before the classes named by ``LLM(logits_processors=...)`` /
``--logits-processors``. The entry points name the classes below: each is one of
``constrained.LOGITS_PROCESSORS`` (a ``DualInterfaceProcessor``, so both loaders accept it),
which goes **inert** (no slot table, no work, never applies anything) in an engine whose
``logits_processors`` also names one of ours: code written for the flag keeps working, in its
own order and subset, and nothing is applied twice.

**Which options an engine applies** (``applied_options``), for admission's registration check:
the flag's processors, plus the entry points' where vLLM builds them. vLLM builds none for a
pooling model, none from entry points under Model Runner V1 with speculative decoding (the
flag's are refused there at start-up; the entry points' are silently skipped), and none on
TPU; our options are then refused naming the reason. Under Model Runner V1 with async
scheduling (GPU), vLLM fills the ``-1`` placeholders of a request's output tokens only when the
flag names processors: entry-point-only processors that read output tokens (penalties, DRY,
grammar, no-repeat-ngram) would see ``-1`` and are refused there, naming the fix.

**The server.** ``EndpointPlugin`` (entry point ``constrained`` of ``vllm.endpoint_plugins``;
vLLM loads it only when ``VLLM_PLUGINS`` names ``constrained``) adds our middleware
(``stream_checks.check_xargs_off_the_loop``) and turns on the routing of ``response_format``,
``structured_outputs`` and tool calls to our processors, as our launcher does.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from typing import Any

from constrained.admission import nothing_to_admit
from constrained.processors.base import DualInterfaceProcessor
from constrained.processors.dry import DryProcessor as _DryProcessor
from constrained.processors.grammar_mask import GrammarMaskProcessor as _GrammarMaskProcessor
from constrained.processors.logit_bias import LogitBiasProcessor as _LogitBiasProcessor
from constrained.processors.min_p import MinPProcessor as _MinPProcessor
from constrained.processors.no_repeat_ngram import NoRepeatNGramProcessor as _NoRepeatNGramProcessor
from constrained.processors.penalties import PenaltiesProcessor as _PenaltiesProcessor
from constrained.processors.top_n_sigma import TopNSigmaProcessor as _TopNSigmaProcessor
from constrained.processors.typical_p import TypicalPProcessor as _TypicalPProcessor
from constrained.processors.xtc import XtcProcessor as _XtcProcessor

LOGITS_GROUP = "vllm.logits_processors"
ENDPOINT_GROUP = "vllm.endpoint_plugins"
PLUGIN_NAME = "constrained"  # the name VLLM_PLUGINS must list for the server side


def names_ours(entries: Iterable[Any] | None) -> bool:
    """Whether a ``logits_processors`` list names one of our processors."""
    for entry in entries or ():
        if isinstance(entry, type):
            if issubclass(entry, DualInterfaceProcessor) and entry.__module__.startswith(
                "constrained."
            ):
                return True
        elif isinstance(entry, str) and entry.split(":", 1)[0].startswith("constrained."):
            return True
    return False


def _flag_entries(vllm_config: Any) -> tuple[Any, ...]:
    model_config = getattr(vllm_config, "model_config", None)
    return tuple(getattr(model_config, "logits_processors", None) or ())


def _flag_on_stack_names_ours(frame: Any) -> bool:
    """Whether the vLLM ``InputProcessor`` calling ``validate_params`` (a few frames up) has
    a ``logits_processors`` flag naming ours (a few frame reads, no import)."""
    try:
        for _ in range(_STACK_FRAMES):
            if frame is None:
                return False
            owner = frame.f_locals.get("self")
            if type(owner).__name__ == "InputProcessor":
                return names_ours(getattr(owner.model_config, "logits_processors", None))
            frame = frame.f_back
        return False
    finally:
        del frame


_STACK_FRAMES = 8


def entry_points_active(vllm_config: Any) -> bool:
    """Whether our entry-point classes apply options in this engine: not when its
    ``logits_processors`` names ours, nor with ``CONSTRAINED_ENTRY_POINTS=0``."""
    from constrained.settings import settings

    return settings().entry_points and not names_ours(_flag_entries(vllm_config))


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
        if not _flag_on_stack_names_ours(sys._getframe(1)):
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


# One class per processor, named as the one it extends (engine stats key by class name), in
# application order (the entry points' order).
class LogitBiasProcessor(EntryPoint, _LogitBiasProcessor):
    pass


class PenaltiesProcessor(EntryPoint, _PenaltiesProcessor):
    pass


class DryProcessor(EntryPoint, _DryProcessor):
    pass


class GrammarMaskProcessor(EntryPoint, _GrammarMaskProcessor):
    pass


class NoRepeatNGramProcessor(EntryPoint, _NoRepeatNGramProcessor):
    pass


class TopNSigmaProcessor(EntryPoint, _TopNSigmaProcessor):
    pass


class TypicalPProcessor(EntryPoint, _TypicalPProcessor):
    pass


class XtcProcessor(EntryPoint, _XtcProcessor):
    pass


class MinPProcessor(EntryPoint, _MinPProcessor):
    pass


ENTRY_POINT_CLASSES = (
    LogitBiasProcessor, PenaltiesProcessor, DryProcessor, GrammarMaskProcessor,
    NoRepeatNGramProcessor, TopNSigmaProcessor, TypicalPProcessor, XtcProcessor, MinPProcessor,
)  # fmt: skip
# Processors that read a request's output tokens (their values, not only their count).
READS_OUTPUT_TOKENS = (_PenaltiesProcessor, _DryProcessor, _GrammarMaskProcessor,
                       _NoRepeatNGramProcessor)  # fmt: skip


@functools.cache
def installed_entry_points() -> tuple[type, ...]:
    """The classes of the ``vllm.logits_processors`` entry points installed here (vLLM loads
    the same ones, every engine)."""
    from importlib.metadata import entry_points

    classes = []
    for entry in entry_points(group=LOGITS_GROUP):
        try:
            classes.append(entry.load())
        except Exception:  # vLLM itself refuses to start with it: nothing to admit
            continue
    return tuple(classes)


def no_custom_processors_reason(vllm_config: Any) -> str | None:
    """Why vLLM builds no entry-point processors for this engine, or ``None`` when it does."""
    model_config = getattr(vllm_config, "model_config", None)
    if getattr(model_config, "runner_type", None) == "pooling":
        return "this is a pooling model, for which vLLM builds no logits processors"
    v2 = bool(getattr(vllm_config, "use_v2_model_runner", False))
    if not v2 and getattr(vllm_config, "speculative_config", None) is not None:
        return (
            "vLLM's Model Runner V1 builds no installed (entry-point) logits processors "
            "when speculative decoding is on"
        )
    try:
        from vllm.platforms import current_platform

        if current_platform.is_tpu():
            return "vLLM on TPU builds no custom logits processors"
    except Exception:  # no platform: nothing more to say
        pass
    return None


def _async_v1(vllm_config: Any) -> bool:
    """Model Runner V1 with async scheduling: output lists hold ``-1`` until vLLM fills them,
    which it does only for the flag's processors."""
    if getattr(vllm_config, "use_v2_model_runner", False):
        return False
    scheduler = getattr(vllm_config, "scheduler_config", None)
    return bool(getattr(scheduler, "async_scheduling", False))


def applied_options(vllm_config: Any) -> tuple[frozenset[str], dict[str, str]]:
    """The options this engine's processors apply, and for options it does not apply for a
    reason other than "not registered", that reason (by option).

    The flag's classes (``model_config.logits_processors``) always count; the entry points'
    count unless the flag names ours (they are then inert) or vLLM builds none of them here.
    """
    flag = _flag_entries(vllm_config)
    from constrained.admission import resolve_processor

    applied: set[str] = set()
    for entry in flag:
        applied |= getattr(resolve_processor(entry), "OPTIONS", frozenset())
    reasons: dict[str, str] = {}
    installed = installed_entry_points()
    reason = no_custom_processors_reason(vllm_config)
    from constrained.settings import settings

    flagged = names_ours(flag)
    opted_out = not settings().entry_points
    async_v1 = _async_v1(vllm_config)
    for cls in installed:
        options = getattr(cls, "OPTIONS", frozenset())
        ours = issubclass(cls, EntryPoint)
        if ours and flagged:
            continue
        if ours and opted_out:
            reasons.update(
                dict.fromkeys(
                    options,
                    "the installed processors are switched off (CONSTRAINED_ENTRY_POINTS=0); "
                    "register constrained.LOGITS_PROCESSORS to use them",
                )
            )
        elif reason is not None:
            reasons.update(dict.fromkeys(options, reason))
        elif ours and async_v1 and issubclass(cls, READS_OUTPUT_TOKENS):
            reasons.update(
                dict.fromkeys(
                    options,
                    "vLLM's Model Runner V1 with async scheduling gives installed (entry-point) "
                    "processors placeholder output tokens; name our processors with "
                    "--logits-processors / LLM(logits_processors=constrained.LOGITS_PROCESSORS), "
                    "or use Model Runner V2, or --no-async-scheduling",
                )
            )
        else:
            applied |= options
    return frozenset(applied), {k: v for k, v in reasons.items() if k not in applied}


# vLLM's own logits processors that read ``extra_args``, and the keys they read.
KNOWN_PROCESSOR_KEYS: dict[str, frozenset[str]] = {
    "vllm.model_executor.models.deepseek_ocr.NGramPerReqLogitsProcessor": frozenset(
        {"ngram_size", "window_size", "whitelist_token_ids"}
    ),
}


def built_processors(vllm_config: Any) -> tuple[type, ...] | None:
    """The logits-processor classes this engine builds: the flag's and the installed entry
    points' (none where vLLM builds none); ``None`` when a flag entry cannot be loaded here."""
    if no_custom_processors_reason(vllm_config) is not None:
        return ()
    from constrained.admission import resolve_processor

    try:
        flag = tuple(resolve_processor(entry) for entry in _flag_entries(vllm_config))
    except Exception:  # vLLM loaded it in the engine; we cannot tell what it reads
        return None
    return (*flag, *installed_entry_points())


def keys_of_other_processors(vllm_config: Any) -> frozenset[str] | None:
    """The ``extra_args`` keys this engine's processors that are not ours read, or ``None``
    when one of them is a processor whose keys we do not know (any key may be its)."""
    classes = built_processors(vllm_config)
    if classes is None:
        return None
    keys: set[str] = set()
    for cls in classes:
        if names_ours([cls]):
            continue
        known = KNOWN_PROCESSOR_KEYS.get(f"{cls.__module__}.{cls.__qualname__}")
        if known is None:
            return None
        keys |= known
    return frozenset(keys)


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
