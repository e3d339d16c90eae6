"""vLLM's ``InputProcessor``: the one place that knows vLLM's frontend, found on the call stack
at admission, and told when it is built.

``validate_params`` is a classmethod that vLLM calls with only the request's parameters; the
engine's config (logits width, tokenizer, the ``--logits-processors`` flag) and the loaded
tokenizer live on the ``InputProcessor`` that calls it, a few frames up. vLLM builds that
``InputProcessor`` before it starts the engine core, and nothing of ours runs in the frontend
then: ``call_after_init`` runs a hook of ours right after it is built (``plugin.register``).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from constrained.engine_processors import names_ours

logger = logging.getLogger(__name__)

# How far up the stack vLLM's InputProcessor sits above ``validate_params`` (4 in vLLM 0.32).

_MAX_FRAMES = 16


class AdmissionUnavailable(RuntimeError):
    """vLLM's internals moved: the served model's config cannot be found at admission."""


def input_processor_at_admission() -> Any:
    """vLLM's ``InputProcessor`` running this admission, found on the call stack.

    ``validate_params`` is a classmethod that vLLM calls with only the request's parameters;
    the model config (logits width, tokenizer, registered processors) and the loaded tokenizer
    live on the ``InputProcessor`` that calls it (``InputProcessor._validate_params`` in vLLM
    0.32/0.33).

    Raises:
        AdmissionUnavailable: no ``InputProcessor`` within a few frames (vLLM changed how it
            calls ``validate_params``, or it was called outside vLLM's admission).
    """
    caller = sys._getframe(1)
    try:
        return find_input_processor(caller)[0]
    finally:
        del caller


def find_input_processor(frame: FrameType | None) -> tuple[Any, int]:
    """The ``InputProcessor`` at or above ``frame``, and how many frames above it sits.

    Raises:
        AdmissionUnavailable: as ``input_processor_at_admission``.
    """
    from vllm.config import ModelConfig
    from vllm.v1.engine.input_processor import InputProcessor

    try:
        for depth in range(_MAX_FRAMES):
            if frame is None:
                break
            owner = frame.f_locals.get("self")
            if isinstance(owner, InputProcessor) and isinstance(owner.model_config, ModelConfig):
                return owner, depth
            frame = frame.f_back
    finally:
        del frame
    raise AdmissionUnavailable(
        "constrained: validate_params was not called from vLLM's InputProcessor, so the "
        "served model's config (logits width, tokenizer, registered processors) is unknown. "
        "This vLLM version calls logits-processor validation differently from 0.32/0.33; "
        "please report it with your vLLM version."
    )


def self_at(frame: FrameType | None, depth: int) -> Any:
    """The ``self`` of the frame ``depth`` frames above ``frame`` (one frame read, no walk)."""
    try:
        for _ in range(depth):
            frame = frame.f_back if frame is not None else None
        return frame.f_locals.get("self") if frame is not None else None
    finally:
        del frame


def loaded_tokenizer(input_processor: Any) -> Any:
    """The tokenizer vLLM's frontend already loaded, or None (so the vocabulary is not loaded
    a second time in this process; ``load_vocab`` uses it only if it is a fast HF one)."""
    try:
        return input_processor.tokenizer
    except Exception:  # no tokenizer (skip_tokenizer_init) or vLLM moved it
        return None


def flag_on_stack_names_ours(frame: FrameType | None) -> bool:
    """Whether the ``InputProcessor`` at or above ``frame`` has a ``logits_processors`` flag
    naming ours; ``False`` when there is none."""
    try:
        owner, _ = find_input_processor(frame)
    except AdmissionUnavailable:
        return False
    finally:
        del frame
    return names_ours(getattr(owner.model_config, "logits_processors", None))


def call_after_init(hook: Callable[[Any], object]) -> None:
    """Run ``hook(input_processor)`` after each ``InputProcessor`` vLLM builds from now on (in
    this process: ``LLM``'s, ``AsyncLLM``'s, each API server's), once however often this is
    called; a hook that raises is logged and never fails vLLM's start-up."""
    from vllm.v1.engine.input_processor import InputProcessor

    init = InputProcessor.__init__
    if getattr(init, "_constrained_hook", None) is hook:
        return

    @functools.wraps(init)
    def init_then_hook(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            hook(self)
        except Exception:  # ours is an optimisation: vLLM starts without it
            logger.warning("constrained: %s failed", hook.__name__, exc_info=True)

    init_then_hook._constrained_hook = hook  # type: ignore[attr-defined]
    InputProcessor.__init__ = init_then_hook  # type: ignore[method-assign]
