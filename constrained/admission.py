"""Admission: every check a request's options get before a processor applies them, in one place.

Three callers, one answer: each processor's ``validate_params`` (vLLM's frontend, per request:
vLLM calls it once per registered class, and the first call's outcome answers the others, see
``validate_at_admission``), the streaming middleware (``stream_checks``, before the HTTP 200),
and the engine-side add (``options_for_engine``, which only parses: admission already refused
what is bad).

A request is refused (``OptionError``, a ``ValueError`` naming the field: HTTP 400 from the
server, an exception from ``LLM.generate`` offline) when an option is invalid or unknown, set
twice (ours and vLLM's built-in twin), outside the served model's logits width, applied by a
processor this engine did not register (it would be silently ignored), or a constraint that
does not compile in time with the served tokenizer.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import difflib
import importlib
import sys
import threading
import weakref
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any

from constrained.options import VLLM_OCR_ALIASES, OptionError, Options
from constrained.settings import settings

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
        return _find_input_processor(caller)[0]
    finally:
        del caller


def _find_input_processor(frame: FrameType | None) -> tuple[Any, int]:
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


def _self_at(frame: FrameType | None, depth: int) -> Any:
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


# ---- which of our options this engine applies ---------------------------------------------


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
    from constrained import LOGITS_PROCESSORS

    for entry in LOGITS_PROCESSORS:
        if option in resolve_processor(entry).OPTIONS:
            return entry
    raise KeyError(option)


def refuse_unregistered(options: Options, registered: Iterable[str | type]) -> None:
    """Refuse an option whose processor is not among ``registered`` (entries)."""
    refuse_not_applied(options, options_applied_by(registered))


def refuse_not_applied(
    options: Options, applied: frozenset[str], reasons: Mapping[str, str] | None = None
) -> None:
    """Refuse an option this engine does not apply (never drop it): ``applied``, the options
    its processors apply; ``reasons``, why an option is not applied although its processor
    is installed (vLLM builds none here: ``plugin.applied_options``)."""
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
    """The options this engine applies and why others are not (``plugin.applied_options``:
    the flag's processors and the installed entry points vLLM builds here)."""
    from constrained.plugin import applied_options

    return applied_options(_engine_config(model_config, vllm_config))


def keys_of_others(model_config: Any, vllm_config: Any = None) -> frozenset[str] | None:
    """The ``extra_args`` keys this engine's processors that are not ours read; ``None``
    when one of them is a processor whose keys we do not know
    (``plugin.keys_of_other_processors``)."""
    from constrained.plugin import keys_of_other_processors

    return keys_of_other_processors(_engine_config(model_config, vllm_config))


def _engine_config(model_config: Any, vllm_config: Any) -> Any:
    if vllm_config is None:  # only the model config known: the flag's list, entry points
        from types import SimpleNamespace

        vllm_config = SimpleNamespace(model_config=model_config)
    return vllm_config


# ---- constraints ------------------------------------------------------------------------------


def spec_of(options: Options) -> Any:
    """The ``GrammarSpec`` of a request's options, or ``None`` when it has no constraint."""
    from constrained.grammars import GrammarSpec

    constraint = options.constraint()
    if constraint is None:
        return None
    kind, source = constraint
    kwargs: dict[str, Any] = {}
    if options.whitespace is not None:
        kwargs["whitespace"] = options.whitespace
    if options.max_whitespace is not None:
        kwargs["max_whitespace"] = options.max_whitespace
    if options.disable_additional_properties:
        kwargs["close_objects"] = True
    return GrammarSpec(kind, source, options.grammar_backend or "auto", **kwargs)


def tokenizer_path(model_config: Any) -> str:
    return str(getattr(model_config, "tokenizer", None) or model_config.model)


def closes_at_budget(options: Options, params: Any) -> bool:
    """Whether a constrained request finishes by its ``max_tokens`` (``close_at_max_tokens``)."""
    return (
        options.constraint() is not None
        and options.close_at_max_tokens is not False
        and getattr(params, "max_tokens", None) is not None
        and not getattr(params, "ignore_eos", False)
    )


def compile_constraint(
    options: Options, model_config: Any, tokenizer: Any = None, max_tokens: int | None = None
) -> None:
    """Compile the request's constraint (if any) with the served tokenizer, or refuse it.

    The compile is cached, so the engine's own compile of the same constraint is a hit.
    With ``max_tokens`` (and ``close_at_max_tokens`` on), also refuse a budget too small for
    any complete output we can find (``grammars/closing.py``).

    Raises:
        OptionError: naming the constraint's field, when it does not compile in time;
            naming ``max_tokens`` when no complete output fits in it.
    """
    from constrained.grammars import GrammarError, compiler_for, load_vocab

    spec = spec_of(options)
    if spec is None:
        return
    width = int(model_config.get_vocab_size())
    vocab = load_vocab(tokenizer_path(model_config), width, hf_tokenizer=tokenizer)
    field = options.constraint_field() or spec.kind
    try:
        grammar = compiler_for(vocab).compile(spec)
    except GrammarError as exc:
        raise OptionError(field, str(exc)) from None
    except Exception as exc:  # a backend bug is still this request's problem only
        raise OptionError(field, f"cannot be compiled ({exc})") from None
    if max_tokens is not None and options.close_at_max_tokens is not False:
        marker = 0
        if options.reasoning_end is not None:
            from constrained.grammars.marker import marker_for

            marker = len(marker_for(vocab, options.reasoning_end).ids)
        check_budget(grammar, vocab, field, max_tokens, marker)


def check_budget(grammar: Any, vocab: Any, kind: str, max_tokens: int, marker: int = 0) -> None:
    """Refuse a ``max_tokens`` no complete output of the constraint fits in (after the
    ``marker`` tokens that end thinking, when the request thinks first)."""
    from constrained.grammars.closing import ROOT_WITNESS_TOKENS, root_witness

    witness = root_witness(grammar, vocab)  # one walk per compiled grammar
    if witness is None:
        if max_tokens > ROOT_WITNESS_TOKENS:  # admitted: the engine looks again as the
            return  # budget runs down (docs/budget.md)
        raise OptionError(
            "max_tokens",
            f"is {max_tokens}, and no complete output of this {kind} was found within "
            f"{ROOT_WITNESS_TOKENS} tokens: the {kind} may have no valid instance at all "
            "(keywords no value satisfies together), or need more tokens than that; check "
            "it, raise max_tokens, or set close_at_max_tokens=false to let the output be cut "
            "at max_tokens",
        )
    needed = marker + len(witness) + 1  # and end-of-sequence
    if needed > max_tokens:
        raise OptionError(
            "max_tokens",
            f"is {max_tokens}, but the shortest complete output of this {kind} found needs "
            f"{needed} tokens ({'reasoning_end, ' if marker else ''}end-of-sequence "
            f"included); raise max_tokens to at least "
            f"{needed}, or set close_at_max_tokens=false to let the output be cut",
        )


# ---- the three entry points -----------------------------------------------------------------


def _check(
    options: Options | None,
    model_config: Any,
    tokenizer: Any = None,
    params: Any = None,
    vllm_config: Any = None,
) -> None:
    if options is None:
        return
    applied, reasons = engine_applies(model_config, vllm_config)
    refuse_not_applied(options, applied, reasons)
    closes = params is not None and closes_at_budget(options, params)
    compile_constraint(options, model_config, tokenizer, params.max_tokens if closes else None)


def admit(params: Any, model_config: Any, tokenizer: Any = None, vllm_config: Any = None) -> None:
    """Every admission check for one request's ``SamplingParams``.

    Raises:
        OptionError: the first problem, naming the option.
    """
    width = int(model_config.get_vocab_size())
    others = keys_of_others(model_config, vllm_config)
    options = options_from_params(params, logits_width=width, others=others)
    _check(options, model_config, tokenizer, params, vllm_config)


def validate_at_admission(params: Any) -> None:
    """What every processor's ``validate_params`` runs: admission, once per request.

    vLLM calls ``validate_params`` once per registered class (nine for
    ``constrained.LOGITS_PROCESSORS``), back to back, with the same params object. The first
    call runs the admission (find vLLM's ``InputProcessor`` on the stack, ``prepare_request``,
    parse, registration check, compile) and remembers its outcome on the params object (by
    identity, held); the other calls return it, or raise the same refusal again, without
    walking the stack or compiling (they read one frame, to see it is the same engine).

    Reuse is safe because an outcome answers only the request it was decided for. It is
    reused when the params object is the same one, unchanged since its admission (compared
    with a copy taken after it, so ``prepare_request``'s own writes do not count as a change
    and the 2nd..9th call match; the caller changing any field does, and is admitted anew),
    admitted by the same engine (vLLM allows one params object to be shared across engines),
    under the same ``settings()``. ``LLM.generate`` with one ``SamplingParams`` for many
    prompts validates that one object once per prompt (vLLM clones it only after
    validation, ``entrypoints/common/offline.py``: ``[params] * num_requests``): each prompt
    gets the same verdict, admission runs once for all of them, and a refusal is raised for
    each. A refusal for a compile that ran out of time is not
    remembered: a later try may find the compile done.

    Raises:
        OptionError: the request's first problem, naming the option.
        AdmissionUnavailable: not called from vLLM's admission.
    """
    if nothing_to_admit(params):
        return  # no key of ours (nor a near miss): nothing to check, change or remember
    caller = sys._getframe(1)
    try:
        entry = _admissions.get(params)
        current = entry is not None and entry.answers(params)
        if current and entry.engine_is(_self_at(caller, entry.depth)):
            entry.reraise()
            return
        owner, depth = _find_input_processor(caller)
    finally:
        del caller
    if current and entry.engine_is(owner):
        entry.reraise()
        return
    try:
        _admit_once(params, owner)
    except OptionError as exc:
        _remember(params, owner, depth, exc)
        raise
    _remember(params, owner, depth, None)


def _admit_once(params: Any, owner: Any) -> None:
    """The admission itself, for one request on the engine of vLLM's ``InputProcessor``."""
    tokenizer = loaded_tokenizer(owner)
    prepare_request(params, getattr(owner, "vllm_config", None), tokenizer)
    admit(params, owner.model_config, tokenizer, getattr(owner, "vllm_config", None))


@dataclasses.dataclass(frozen=True)
class _Admitted:
    """One request's admission outcome, and what it was decided for."""

    snapshot: Any  # a copy of the params just after admission (prepare_request's writes in)
    engine: weakref.ref[Any]  # the InputProcessor (weak: the memo keeps no engine alive)
    depth: int  # how far above validate_params's caller it sat on the stack
    settings_seen: Any  # settings() then (a reset() reads the environment again)
    refusal: OptionError | None  # raised again as a copy (no traceback kept)

    def answers(self, params: Any) -> bool:
        try:
            return self.settings_seen is settings() and bool(params == self.snapshot)
        except Exception:  # an uncomparable field: admit anew
            return False

    def engine_is(self, owner: Any) -> bool:
        return owner is not None and owner is self.engine()

    def reraise(self) -> None:
        if self.refusal is not None:
            raise _copy_error(self.refusal)


def _copy_error(error: OptionError) -> OptionError:
    """The same refusal (type, message, field) as a new exception, without a traceback."""
    copied = type(error).__new__(type(error), *error.args)
    copied.args = error.args
    copied.__dict__.update(error.__dict__)
    return copied


def _remember(params: Any, owner: Any, depth: int, refusal: OptionError | None) -> None:
    from constrained.grammars.compiler import COMPILE_TIMEOUT_ENV

    if refusal is not None and COMPILE_TIMEOUT_ENV in getattr(refusal, "reason", ""):
        _admissions.discard(params)  # ran out of time: the next try may find it compiled
        return
    try:
        entry = _Admitted(
            snapshot=copy.deepcopy(params),
            engine=weakref.ref(owner),
            depth=depth,
            settings_seen=settings(),
            refusal=None if refusal is None else _copy_error(refusal),
        )
    except Exception:  # params that cannot be copied, an engine without weak references
        _admissions.discard(params)
        return
    _admissions.put(params, entry)


def prepare_request(params: Any, vllm_config: Any, tokenizer: Any = None) -> None:
    """What admission writes into a request before checking it, in place (the engine then
    reads the same): on our launcher, vLLM's own structured outputs moved to our options
    (``openai_routing.take_over``: tool calls); a constrained request's default
    ``reasoning_end``, the engine's reasoning parser's marker (``reasoning_parser``).

    Raises:
        OptionError: vLLM's structured outputs and one of our constraints both given.
    """
    from constrained.openai_routing import take_over
    from constrained.reasoning_parser import thinking_ends, with_default_reasoning_end

    if settings().route_structured_outputs:
        take_over(params, settings().tool_call_parser)
    marker = thinking_ends(vllm_config, tokenizer).marker
    added = with_default_reasoning_end(getattr(params, "extra_args", None), marker)
    if added is not None:
        params.extra_args = added


def check_xargs(
    xargs: Any, vllm_config: Any = None, tokenizer: Any = None, budget: Any = None
) -> str | None:
    """The error admission would give these ``vllm_xargs``, or ``None`` (server middleware).

    Compiles the constraint (cached, and saved to the store), so vLLM's own admission of the
    same request, on the event loop, finds it compiled. ``budget``: the request's
    ``max_tokens`` and ``ignore_eos`` (attributes), when it gave them."""
    if not isinstance(xargs, dict):
        return None  # vLLM's request model refuses it
    from constrained.reasoning_parser import thinking_ends, with_default_reasoning_end

    model_config = getattr(vllm_config, "model_config", None)
    width = int(model_config.get_vocab_size()) if model_config is not None else None
    try:
        marker = thinking_ends(vllm_config, tokenizer).marker
        xargs = with_default_reasoning_end(xargs, marker) or xargs  # as admission will
        others = keys_of_others(model_config, vllm_config) if model_config is not None else None
        options = parse_extra_args(xargs, logits_width=width, others=others)
        if model_config is not None:
            _check(options, model_config, tokenizer, budget, vllm_config)
    except OptionError as exc:
        return str(exc)
    except Exception:  # anything unexpected: let the engine's own check answer
        return None
    return None


def options_for_engine(params: Any, logits_width: int) -> Options | None:
    """The engine-side parse of a request admission already checked.

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
            result = options_from_params(params, logits_width=logits_width)
        except OptionError as exc:
            result = _copy_error(exc)
        _engine_parses.put(params, (logits_width, result))
    if isinstance(result, OptionError):
        raise _copy_error(result)
    return result


# ---- parsing a request ------------------------------------------------------------------------

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
UNKNOWN_KEYS_ENV = "CONSTRAINED_UNKNOWN_EXTRA_ARGS"

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
) -> Options | None:
    """Our options from ``extra_args`` / ``vllm_xargs``; ``None`` when none is active.
    ``others``: as ``refuse_unknown_keys``.

    Raises:
        OptionError: a key is unknown (with a did-you-mean hint), or an option is invalid.
    """
    if not extra_args:
        return None
    refuse_unknown_keys(extra_args, others)
    return Options.from_extra_args(extra_args, logits_width=logits_width)


# vLLM's own SamplingParams fields with the same meaning as ours: setting both would apply twice.
_BUILTIN_TWINS: dict[str, tuple[str, Any]] = {
    "logit_bias": ("logit_bias", lambda value: bool(value)),
    "min_p": ("min_p", lambda value: bool(value)),
    "repetition_penalty": ("repetition_penalty", lambda value: value not in (None, 1.0)),
    "frequency_penalty": ("frequency_penalty", lambda value: bool(value)),
    "presence_penalty": ("presence_penalty", lambda value: bool(value)),
}


class _RecentByIdentity:
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


_MEMO_SIZE = 256
# Frontend: each request's admission outcome (``validate_at_admission``).
_admissions = _RecentByIdentity(_MEMO_SIZE)
# Engine: each request's parse (``options_for_engine``); the engine's params objects are its
# own copies, never the ones admission saw.
_engine_parses = _RecentByIdentity(_MEMO_SIZE)


def options_from_params(
    params: Any, *, logits_width: int | None = None, others: frozenset[str] | None = None
) -> Options | None:
    """Parse and check a request's ``SamplingParams``: our options, refusing double application.
    ``others``: as ``refuse_unknown_keys``.

    Parses every time; admission (``validate_at_admission``) and the engine
    (``options_for_engine``) remember the outcome per request.

    Raises:
        OptionError: invalid or unknown option, or an option also set as vLLM's built-in twin.
    """
    options = parse_extra_args(
        getattr(params, "extra_args", None), logits_width=logits_width, others=others
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
