"""Which of our options this engine applies, and which keys its other processors read.

An engine builds the classes of its ``--logits-processors`` flag
(``model_config.logits_processors``) and, where vLLM builds them, every class of the
installed ``vllm.logits_processors`` entry points; ours are named in ``processor_table``.
Admission refuses an option no built processor applies (``refuse_not_applied``), and a key no
built processor reads (``request_options.refuse_unknown_keys`` with
``keys_of_other_processors``): nothing is silently dropped.

It imports no processor and nothing that imports one: a class is ours by its module.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from constrained.options import OptionError, Options
from constrained.processor_table import LOGITS_PROCESSORS, PLUGIN_MODULE, PROCESSORS
from constrained.settings import settings

LOGITS_GROUP = "vllm.logits_processors"


def names_ours(entries: Iterable[Any] | None) -> bool:
    """Whether a ``logits_processors`` list names one of our processors."""
    for entry in entries or ():
        if isinstance(entry, type):
            if entry.__module__.startswith("constrained."):
                return True
        elif isinstance(entry, str) and entry.split(":", 1)[0].startswith("constrained."):
            return True
    return False


def _flag_entries(vllm_config: Any) -> tuple[Any, ...]:
    model_config = getattr(vllm_config, "model_config", None)
    return tuple(getattr(model_config, "logits_processors", None) or ())


def entry_points_active(vllm_config: Any) -> bool:
    """Whether our entry-point classes apply options in this engine: not when its
    ``logits_processors`` names ours, nor with ``CONSTRAINED_ENTRY_POINTS=0``."""
    return settings().entry_points and not names_ours(_flag_entries(vllm_config))


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
    applied: set[str] = set()
    for entry in flag:
        applied |= getattr(resolve_processor(entry), "OPTIONS", frozenset())
    reasons: dict[str, str] = {}
    installed = installed_entry_points()
    reason = no_custom_processors_reason(vllm_config)
    flagged = names_ours(flag)
    opted_out = not settings().entry_points
    async_v1 = _async_v1(vllm_config)
    for cls in installed:
        options = getattr(cls, "OPTIONS", frozenset())
        ours = cls.__module__ == PLUGIN_MODULE  # our entry-point classes
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
        elif ours and async_v1 and _reads_output_tokens(cls):
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


def resolve_processor(entry: str | type) -> type:
    """A ``--logits-processors`` entry (``"pkg.mod:Class"`` or a class) as a class."""
    if isinstance(entry, type):
        return entry
    module, _, qualname = entry.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def options_applied_by(entries: Iterable[str | type]) -> frozenset[str]:
    """The option names the registered processors apply (each of ours declares ``OPTIONS``)."""
    names: set[str] = set()
    for entry in entries:
        names |= getattr(resolve_processor(entry), "OPTIONS", frozenset())
    return frozenset(names)


def owner_of(option: str) -> str:
    """The entry of ``constrained.LOGITS_PROCESSORS`` that applies ``option``."""
    for entry in LOGITS_PROCESSORS:
        if option in resolve_processor(entry).OPTIONS:
            return entry
    raise KeyError(option)


def refuse_not_applied(
    options: Options, applied: frozenset[str], reasons: Mapping[str, str] | None = None
) -> None:
    """Refuse an option this engine does not apply (never drop it): ``applied``, the options
    its processors apply; ``reasons``, why an option is not applied although its processor
    is installed (vLLM builds none here: ``applied_options``)."""
    reasons = reasons or {}
    for name in type(options).model_fields:  # field order: the same error every time
        if getattr(options, name) is not None and name not in applied:
            if name in reasons:
                raise OptionError(name, f"is not applied by this engine: {reasons[name]}")
            raise OptionError(
                name,
                f"is not applied by this engine: its processor {owner_of(name)} is not "
                "registered. Install the package (`pip install constrained`: vLLM then loads "
                "all its processors from entry points) and name none of them, or register "
                "all of constrained.LOGITS_PROCESSORS (LLM(logits_processors=...), "
                "--logits-processors).",
            )


def engine_applies(model_config: Any, vllm_config: Any = None) -> tuple[frozenset[str], dict]:
    """The options this engine applies and why others are not (``applied_options``:
    the flag's processors and the installed entry points vLLM builds here)."""
    return applied_options(_engine_config(model_config, vllm_config))


def keys_of_others(model_config: Any, vllm_config: Any = None) -> frozenset[str] | None:
    """The ``extra_args`` keys this engine's processors that are not ours read; ``None``
    when one of them is a processor whose keys we do not know
    (``keys_of_other_processors``)."""
    return keys_of_other_processors(_engine_config(model_config, vllm_config))


def _engine_config(model_config: Any, vllm_config: Any) -> Any:
    if vllm_config is None:  # only the model config known: the flag's list, entry points
        from types import SimpleNamespace

        vllm_config = SimpleNamespace(model_config=model_config)
    return vllm_config


def _reads_output_tokens(cls: type) -> bool:
    """Whether one of our classes reads the values of a request's output tokens."""
    return any(row.name == cls.__name__ and row.reads_output_tokens for row in PROCESSORS)
