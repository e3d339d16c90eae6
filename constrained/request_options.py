"""A request's options, parsed: the keys of its ``extra_args`` and what admission looks at.

vLLM hands every logits processor the same ``extra_args``. Ours are the fields of
``Options`` (and vLLM's DeepSeek-OCR names, ``VLLM_OCR_ALIASES``); vLLM itself reads a few
(``VLLM_EXTRA_ARGS_KEYS``); any other key is another processor's, or nobody's
(``refuse_unknown_keys``). ``options_from_params`` is the parse admission and the engine
share; ``options_for_engine`` remembers it per request on the engine side.
"""

from __future__ import annotations

import collections
import difflib
import threading
from collections.abc import Mapping
from typing import Any

from constrained.options import VLLM_OCR_ALIASES, OptionError, Options
from constrained.settings import settings

# Keys vLLM 0.32 itself reads from ``SamplingParams.extra_args`` (never refused):
# KV / encoder-cache transfer and the KV cache report (``v1/request.py``, the OpenAI
# protocols), the session of ``vllm_xargs`` (``entrypoints/generate/base/serving.py``) and
# the diffusion models' canvas (``utils/diffusion.py``, ``models/diffusion_gemma.py``).
# DeepSeek-OCR's processor's keys are our aliases (``VLLM_OCR_ALIASES``).
VLLM_EXTRA_ARGS_KEYS = frozenset(
    {
        "kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode", "session_id",
        "diffusion_canvas_length", "diffusion_constrained", "diffusion_max_steps",
        "diffusion_pinned", "diffusion_read_only", "diffusion_seed_canvas",
    }
)  # fmt: skip


ALLOWED_KEYS_ENV = "CONSTRAINED_ALLOWED_EXTRA_ARGS"


# Other engines' names for our options (llama.cpp / Ollama, Hugging Face transformers,
# KoboldCpp, text-generation-webui, vLLM's older guided decoding): named in the
# "did you mean" of an unknown key, never accepted as ours.
FOREIGN_NAMES: dict[str, tuple[str, str]] = {
    "repeat_penalty": ("repetition_penalty", "llama.cpp"),
    "rep_pen": ("repetition_penalty", "KoboldCpp"),
    "repeat_last_n": ("penalty_last_n", "llama.cpp"),
    "rep_pen_range": ("penalty_last_n", "KoboldCpp"),
    "repetition_penalty_range": ("penalty_last_n", "text-generation-webui"),
    "no_repeat_ngram": ("no_repeat_ngram_size", "a short form"),
    "encoder_no_repeat_ngram_size": ("no_repeat_ngram_size", "transformers (for the prompt)"),
    "top_nsigma": ("top_n_sigma", "llama.cpp"),
    "nsigma": ("top_n_sigma", "KoboldCpp"),
    "typical": ("typical_p", "llama.cpp's --typical"),
    "typ_p": ("typical_p", "a short form"),
    "sequence_bias": ("logit_bias", "transformers"),
    "guided_json": ("json_schema", "vLLM's older guided decoding"),
    "guided_regex": ("regex", "vLLM's older guided decoding"),
    "guided_grammar": ("grammar", "vLLM's older guided decoding"),
    "guided_choice": ("choice", "vLLM's older guided decoding"),
    "json": ("json_schema", "a short form"),
    "schema": ("json_schema", "a short form"),
}


# How close a key must be to one of our option names to be taken for a typo of it.
NEAR_MISS = 0.75


def _normal(key: str) -> str:
    return key.strip().lower().replace("-", "_").replace(" ", "_")


def near_miss(key: str) -> str | None:
    """The option of ours ``key`` is probably meant as: a typo (case, hyphens, spaces, or a
    close spelling), or another engine's name for it (``FOREIGN_NAMES``); else ``None``."""
    names = [*Options.model_fields, *VLLM_OCR_ALIASES]
    normal = _normal(key)
    if normal in names:
        return normal
    if normal in FOREIGN_NAMES:
        return FOREIGN_NAMES[normal][0]
    hint = difflib.get_close_matches(normal, names, n=1, cutoff=NEAR_MISS)
    return hint[0] if hint else None


def did_you_mean(key: str) -> str:
    """The "did you mean" sentence for an unknown key, or ``""``."""
    hint = near_miss(key)
    if hint is None:
        return ""
    foreign = FOREIGN_NAMES.get(_normal(key))
    origin = f" ({foreign[1]}'s name for it is '{key}')" if foreign else ""
    return f" Did you mean '{hint}'{origin}?"


# Every extra_args key that sets one of our options (an option's name, or its alias).
OPTION_KEYS = frozenset(Options.model_fields) | frozenset(VLLM_OCR_ALIASES)


def uses_our_options(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether ``extra_args`` sets one of our options (what the engine side reads: admission
    already refused every key it would not pass)."""
    if not extra_args:
        return False
    try:
        return not OPTION_KEYS.isdisjoint(extra_args)
    except TypeError:  # not a mapping of hashable keys: the parse says what is wrong
        return True


def keys_need_admission(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether ``extra_args`` has a key admission looks at: one of ours, or one
    ``refuse_unknown_keys`` may refuse (any key that is not vLLM's nor allowed: whether
    another processor of the engine reads it is decided there; with
    ``CONSTRAINED_UNKNOWN_EXTRA_ARGS=pass``, near misses of ours only). A request with
    only vLLM's or allowed keys uses none of our options."""
    if not extra_args:
        return False
    current = settings()
    try:
        return any(_key_needs_admission(key, current) for key in extra_args)
    except TypeError:  # not a mapping of hashable keys: the parse says what is wrong
        return True


def nothing_to_admit(params: Any) -> bool:
    """Whether admission would neither refuse nor change this request (the fast exit of a
    request that uses none of our options): no key of its ``extra_args`` needs admission
    (``keys_need_admission``) and, where our routing is on, it has no vLLM structured
    outputs for ``prepare_request`` to take over. Such a request costs no stack walk, no
    parse and no memo entry."""
    if settings().route_structured_outputs and getattr(params, "structured_outputs", None):
        return False
    return not keys_need_admission(getattr(params, "extra_args", None))


# Each key's verdict under one ``settings()`` object (a reset starts afresh); bounded.
_key_verdicts: tuple[Any, dict[Any, bool]] = (None, {})


_KEY_VERDICTS_MAX = 4096


def _key_needs_admission(key: Any, current: Any) -> bool:
    """Whether an ``extra_args`` key is ours or may be refused by ``refuse_unknown_keys``
    under the settings ``current`` (remembered: a request's keys are few, and recur)."""
    global _key_verdicts
    owner, verdicts = _key_verdicts
    if owner is not current:
        verdicts = {}
        _key_verdicts = (current, verdicts)
    verdict = verdicts.get(key)
    if verdict is None:
        if len(verdicts) >= _KEY_VERDICTS_MAX:
            verdicts.clear()
        verdict = verdicts[key] = _decide_key(key, current)
    return verdict


def _decide_key(key: Any, current: Any) -> bool:
    if key in OPTION_KEYS:
        return True
    allowed = current.allowed_extra_args
    if allowed is None or key in VLLM_EXTRA_ARGS_KEYS or key in allowed:
        return False
    if current.unknown_extra_args == "pass":
        return near_miss(str(key)) is not None
    return True


def refuse_unknown_keys(
    extra_args: Mapping[str, Any], others: frozenset[str] | None = None
) -> None:
    """Refuse a key nobody will read, or one that looks like a typo of ours.

    A key is accepted when it is ours, vLLM's (``VLLM_EXTRA_ARGS_KEYS``), declared for
    another plugin (``CONSTRAINED_ALLOWED_EXTRA_ARGS``), or read by another processor of the
    engine (``others``: the keys of the processors it builds that are not ours, ``None``
    when one of them is a processor whose keys we do not know). Any other key is refused
    ("did you mean" where it is close to one of ours) when ``others`` is known (no processor
    of the engine would read it), and, whatever ``others``, when it is a near miss of one of
    our names. ``CONSTRAINED_UNKNOWN_EXTRA_ARGS=pass`` / ``refuse`` overrides the first rule.
    """
    current = settings()
    allowed = current.allowed_extra_args
    if allowed is None:  # "*": any key
        return
    for key in extra_args:
        if key in OPTION_KEYS or key in VLLM_EXTRA_ARGS_KEYS or key in allowed:
            continue
        if others is not None and key in others:
            continue
        hint = did_you_mean(str(key))
        mode = current.unknown_extra_args
        nobody = mode == "refuse" or (mode == "auto" and others is not None)
        if not hint and not nobody:
            continue  # another processor's, maybe: passed through as vLLM does
        why = "no logits processor of this engine reads it" if nobody else "not one of ours"
        raise OptionError(
            str(key),
            f"unknown option: {why}.{hint} Known options: {', '.join(Options.model_fields)}. "
            f"Keys meant for another plugin can be allowed with {ALLOWED_KEYS_ENV}=key1,key2.",
        )


def parse_extra_args(
    extra_args: Mapping[str, Any] | None,
    *,
    logits_width: int | None = None,
    others: frozenset[str] | None = None,
    admitted: bool = False,
) -> Options | None:
    """Our options from ``extra_args`` / ``vllm_xargs``; ``None`` when none is active.
    ``others``: as ``refuse_unknown_keys``; ``admitted``: as ``Options.from_extra_args``.

    Raises:
        OptionError: a key is unknown (with a did-you-mean hint), or an option is invalid.
    """
    if not extra_args:
        return None
    refuse_unknown_keys(extra_args, others)
    return Options.from_extra_args(extra_args, logits_width=logits_width, admitted=admitted)


# vLLM's own SamplingParams fields with the same meaning as ours: setting both would apply twice.
_BUILTIN_TWINS: dict[str, tuple[str, Any]] = {
    "logit_bias": ("logit_bias", lambda value: bool(value)),
    "min_p": ("min_p", lambda value: bool(value)),
    "repetition_penalty": ("repetition_penalty", lambda value: value not in (None, 1.0)),
    "frequency_penalty": ("frequency_penalty", lambda value: bool(value)),
    "presence_penalty": ("presence_penalty", lambda value: bool(value)),
}


def options_from_params(
    params: Any,
    *,
    logits_width: int | None = None,
    others: frozenset[str] | None = None,
    admitted: bool = False,
) -> Options | None:
    """Parse and check a request's ``SamplingParams``: our options, refusing double application.
    ``others``: as ``refuse_unknown_keys``; ``admitted``: as ``Options.from_extra_args``.

    Parses every time; admission (``validate_at_admission``) and the engine
    (``options_for_engine``) remember the outcome per request.

    Raises:
        OptionError: invalid or unknown option, or an option also set as vLLM's built-in twin.
    """
    options = parse_extra_args(
        getattr(params, "extra_args", None),
        logits_width=logits_width,
        others=others,
        admitted=admitted,
    )
    if options is None:
        return None
    for field, (builtin, is_set) in _BUILTIN_TWINS.items():
        if getattr(options, field) is not None and is_set(getattr(params, builtin, None)):
            raise OptionError(
                field,
                f"also set as vLLM's built-in '{builtin}' for this request; set only one "
                "(both would apply it twice)",
            )
    field = options.constraint_field()
    if field is not None:
        _refuse_grammar_conflicts(field, params)
    return options


def _refuse_grammar_conflicts(field: str, params: Any) -> None:
    """Settings that would mask every token a constraint allows (the sampler then picks junk)."""
    conflicts = {
        "structured_outputs": "vLLM's own structured outputs constrain the same output",
        "min_tokens": "it forbids end-of-sequence where the constraint requires it",
        "allowed_token_ids": "it can forbid every token the constraint allows",
        "bad_words": "it can forbid every token the constraint allows",
    }
    for name, why in conflicts.items():
        if getattr(params, name, None):
            raise OptionError(field, f"cannot be combined with vLLM's '{name}': {why}")


class RecentByIdentity:
    """The answers for the ``size`` most recently used objects, each found by identity.

    The object is held while its answer is, so its ``id`` cannot be reused by another one
    meanwhile; bounded (an answer can hold a request's schema text); thread-safe.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: collections.OrderedDict[int, tuple[Any, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, obj: Any) -> Any:
        """The answer for ``obj``, or ``None``."""
        with self._lock:
            item = self._items.get(id(obj))
            if item is None or item[0] is not obj:
                return None
            self._items.move_to_end(id(obj))
            return item[1]

    def put(self, obj: Any, answer: Any) -> None:
        with self._lock:
            self._items[id(obj)] = (obj, answer)
            self._items.move_to_end(id(obj))
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def discard(self, obj: Any) -> None:
        with self._lock:
            item = self._items.get(id(obj))
            if item is not None and item[0] is obj:
                del self._items[id(obj)]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


MEMO_SIZE = 256  # requests whose parse (or admission) is remembered
# Engine: each request's parse (``options_for_engine``); the engine's params objects are its
# own copies, never the ones admission saw.
_engine_parses = RecentByIdentity(MEMO_SIZE)


def options_for_engine(params: Any, logits_width: int) -> Options | None:
    """The engine-side parse of a request admission already checked (its schema's refusing
    checks are admission's: ``Options.from_extra_args``' ``admitted``).

    The engine adds a request to each registered processor in turn, with the same params
    object (its own copy: vLLM clones the caller's after admission), so the parse is
    remembered per params object and width, and each request is parsed once per engine.

    Raises:
        OptionError: as ``options_from_params`` (admission refused it already).
    """
    if not uses_our_options(getattr(params, "extra_args", None)):
        return None  # no option of ours: nothing to parse or remember
    hit = _engine_parses.get(params)
    if hit is not None and hit[0] == logits_width:
        result = hit[1]
    else:
        try:
            result = options_from_params(params, logits_width=logits_width, admitted=True)
        except OptionError as exc:
            result = copy_error(exc)
        _engine_parses.put(params, (logits_width, result))
    if isinstance(result, OptionError):
        raise copy_error(result)
    return result


def copy_error(error: OptionError) -> OptionError:
    """The same refusal (type, message, field) as a new exception, without a traceback."""
    copied = type(error).__new__(type(error), *error.args)
    copied.args = error.args
    copied.__dict__.update(error.__dict__)
    return copied
