"""What the engine's reasoning parser (vLLM's ``--reasoning-parser``) says ends thinking.

With a reasoning parser, vLLM applies its own structured outputs only after the parser's end
marker (``</think>`` for Qwen3), unless ``enable_in_reasoning`` is set. Our constrained
requests do the same: that marker is their default ``reasoning_end``
(``with_default_reasoning_end``, at admission, where it is written into the request's
options so the engine reads the same). Some parsers end thinking at other tokens too (Qwen3's
``<tool_call>``: an implicit end, a tool call straight from the thinking). While a request
thinks, those tokens are banned (``ThinkingEnds.implicit_ids``, in the grammar processor):
its thinking ends at the marker, where the constraint starts, never in a call the constraint
did not shape.

Example::

    ends = thinking_ends(vllm_config, tokenizer)   # qwen3: marker "</think>"
    extra = with_default_reasoning_end({"json_schema": "{}"}, ends.marker)
    extra["reasoning_end"]                          # "</think>"
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from constrained.options import GRAMMAR_FIELDS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThinkingEnds:
    """The parser's end marker (``None``: no parser, or constraints apply while thinking),
    and the other single tokens that end thinking for it."""

    marker: str | None = None
    implicit_ids: frozenset[int] = frozenset()


def parser_applies(vllm_config: Any) -> str:
    """The engine's reasoning parser's name where constraints wait for its end, else ``""``."""
    config = getattr(vllm_config, "structured_outputs_config", None)
    name = getattr(config, "reasoning_parser", None) or ""
    return "" if getattr(config, "enable_in_reasoning", False) else name


def thinking_ends(vllm_config: Any, tokenizer: Any) -> ThinkingEnds:
    """The engine's ``ThinkingEnds`` (``tokenizer``: the served one, for the parser's ids)."""
    name = parser_applies(vllm_config)
    if not name or tokenizer is None:
        return ThinkingEnds()
    key = (name, id(tokenizer))
    with _LOCK:
        found = _FOUND.get(key)
    if found is None or found[0] is not tokenizer:
        found = (tokenizer, _ends_of(name, tokenizer))
        with _LOCK:
            _FOUND[key] = found  # holds the tokenizer: its id is not reused while cached
    return found[1]


_FOUND: dict[tuple[str, int], tuple[Any, ThinkingEnds]] = {}
_LOCK = threading.Lock()


def _ends_of(name: str, tokenizer: Any) -> ThinkingEnds:
    """Built once per parser and tokenizer (a Qwen3 parser reads the whole vocabulary)."""
    from vllm.reasoning import ReasoningParserManager

    try:
        parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    except Exception as exc:  # vLLM's own serving fails the same way for such a parser
        logger.warning("constrained: reasoning parser %r unusable here (%s): no default "
                       "reasoning_end", name, exc)  # fmt: skip
        return ThinkingEnds()
    marker = parser.reasoning_end_str
    ends = frozenset(getattr(parser, "reasoning_end_token_ids", None) or ())
    own = set(tokenizer.encode(marker, add_special_tokens=False)) if marker else set()
    return ThinkingEnds(marker or None, ends - own)


def with_default_reasoning_end(
    extra_args: Mapping[str, Any] | None, marker: str | None
) -> dict[str, Any] | None:
    """``extra_args`` with ``reasoning_end: marker`` added when the request is constrained
    and gives none; ``None`` when nothing is added."""
    if marker is None or not extra_args or "reasoning_end" in extra_args:
        return None
    if not any(extra_args.get(name) not in (None, False) for name in GRAMMAR_FIELDS):
        return None
    return {**extra_args, "reasoning_end": marker}
