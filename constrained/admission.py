"""Admission: every check a request's options get before a processor applies them, in one place.

Three callers, one answer: each processor's ``validate_params`` (vLLM's frontend, per request:
vLLM calls it once per registered class, and the first call's outcome answers the others, see
``validate_at_admission``), the streaming middleware (``stream_checks``, before the HTTP 200),
and the engine-side add (``request_options.options_for_engine``, which only parses:
admission already refused what is bad). A request's keys and their parse are in
``request_options``, which options this engine applies in ``engine_processors``, and vLLM's
``InputProcessor`` is found on the stack in ``frontend``.

A request is refused (``OptionError``, a ``ValueError`` naming the field: HTTP 400 from the
server, an exception from ``LLM.generate`` offline) when an option is invalid or unknown, set
twice (ours and vLLM's built-in twin), outside the served model's logits width, applied by a
processor this engine did not register (it would be silently ignored), or a constraint that
does not compile in time with the served tokenizer.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import threading
import time
import weakref
from typing import Any

from constrained.engine_processors import engine_applies, keys_of_others, refuse_not_applied
from constrained.frontend import find_input_processor, loaded_tokenizer, self_at
from constrained.helper_cpus import leave_compute_cpus, lower_warm_up_priority
from constrained.options import OptionError, Options
from constrained.request_options import (
    MEMO_SIZE,
    RecentByIdentity,
    copy_error,
    nothing_to_admit,
    options_from_params,
    parse_extra_args,
)
from constrained.settings import settings


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


def served_vocab(
    model_config: Any,
    width: int | None = None,
    tokenizer: Any = None,
    reads_tokenizer: bool = False,
) -> Any:
    """The served tokenizer's ``Vocab`` at the logits ``width`` (the model's by default),
    built once per process and never from a second load where it can be helped: over
    ``tokenizer`` (the frontend's) or vLLM's cached one where this process holds it (the
    engine's structured output manager loads it at start-up), else from the tokenizer's
    record in the compiled-grammar store (``grammars/vocab_record.py``: a worker in a process
    of its own), else loaded (1.8-3.5 s). ``reads_tokenizer``: the caller reads the served
    tokenizer itself (a reasoning parser), so it is loaded, and the record not read."""
    from constrained.grammars import load_vocab

    width = int(model_config.get_vocab_size()) if width is None else width
    return load_vocab(
        tokenizer_path(model_config),
        width,
        hf_tokenizer=tokenizer if tokenizer is not None else _vllm_tokenizer(model_config, True),
        find_tokenizer=lambda: _vllm_tokenizer(model_config),
        records=_records(model_config, reads_tokenizer),
    )


def _records(model_config: Any, reads_tokenizer: bool) -> Any:
    """Where the served tokenizer's record is kept (``RecordPlace``), or ``None`` where it is
    not read: a caller that reads the served tokenizer itself, or a pinned revision (a record
    is found by the files of the tokenizer's directory, and a pinned revision's may not be
    the ones the hub cache names)."""
    from constrained.grammars.vocab_record import RecordPlace

    if reads_tokenizer or getattr(model_config, "tokenizer_revision", None) is not None:
        return None
    names = (str(getattr(model_config, "tokenizer_mode", "")),
             str(getattr(model_config, "trust_remote_code", "")))  # fmt: skip
    return RecordPlace(_record_store, names)


def _record_store() -> Any:
    """The compiled-grammar store for the tokenizer's record, or ``None`` (off, or not
    private: the record is an optimisation; compiles report the store's error)."""
    from constrained.grammars.compiler import default_store
    from constrained.grammars.store import StoreError

    try:
        return default_store()
    except StoreError:
        return None


def _vllm_tokenizer(model_config: Any, held_only: bool = False) -> Any:
    """vLLM's cached tokenizer of ``model_config`` (loaded now unless ``held_only``: then only
    where this process holds one already), or ``None``."""
    try:
        from vllm.tokenizers.registry import cached_tokenizer_from_config

        if held_only and not _holds_vllm_tokenizer():
            return None
        return cached_tokenizer_from_config(model_config=model_config)
    except Exception:  # no tokenizer (skip_tokenizer_init), or vLLM moved it: we load our own
        return None


def _holds_vllm_tokenizer() -> bool:
    """Whether this process holds a tokenizer vLLM loaded."""
    try:
        from vllm.tokenizers.registry import cached_get_tokenizer

        return cached_get_tokenizer.cache_info().currsize > 0
    except Exception:  # (vLLM moved its cache)
        return False


WARM_POLL_S = 0.2  # how often the warm-up looks for the served tokenizer
WARM_PATIENCE_S = 900.0  # then gives up: the first constrained request builds the tables
_WARMING: dict[tuple[Any, ...], threading.Thread] = {}
_WARMING_LOCK = threading.Lock()


def warm_when_served(
    model_config: Any, width: int, reads_tokenizer: bool = False
) -> threading.Thread | None:
    """Build the served vocabulary and the tables its first rows read (``vocab_tables``:
    about 1-1.5 s on two cores) in a daemon thread, as soon as this process can without
    loading the tokenizer, so that a new engine's first constrained request does not wait
    for them (#55). One thread per served vocabulary and process.

    It can when this process holds vLLM's tokenizer (an engine that samples in its own
    process: vLLM loads it after the model and the KV cache, when start-up's work is done),
    when the tokenizer's record is in the store (a worker of its own: the frontend keeps it at
    its first constrained request, or an earlier engine did), or when a first request has
    built the vocabulary here (the store off). Loading the tokenizer here instead slowed
    start-up by half on two cores. After ``WARM_PATIENCE_S`` it gives up; the first
    constrained request's rows then build each table when they first read it, as they do
    when a build here fails (that request reports why). ``None`` for a config that names no
    tokenizer."""
    try:
        path = tokenizer_path(model_config)
    except AttributeError:
        return None

    def wait_then_warm() -> None:
        from constrained.grammars.vocab import is_loaded
        from constrained.grammars.vocab_tables import build_tables

        leave_compute_cpus()
        record = _record_of(model_config, width, reads_tokenizer)
        deadline = time.monotonic() + WARM_PATIENCE_S
        while not (
            _holds_vllm_tokenizer()
            or (record is not None and record[0].has(record[1]))
            or is_loaded(path, width)  # (by a first request)
        ):
            if time.monotonic() > deadline:
                return
            time.sleep(WARM_POLL_S)
        try:
            build_tables(served_vocab(model_config, width, reads_tokenizer=reads_tokenizer))
        except Exception:  # the first constrained request builds it, and reports what fails
            return

    return _warm_once((path, width, reads_tokenizer), wait_then_warm)


def warm_admission(input_processor: Any) -> threading.Thread | None:
    """Build what this frontend's first constrained admission reads (``vocab_tables.
    build_admission_tables``: the served vocabulary over the tokenizer the frontend loaded,
    the tokenizer's record for the workers, llguidance's tokenizer: 0.65-0.75 s for Qwen2 on
    two cores) in a daemon thread, started as soon as vLLM's ``InputProcessor`` is built
    (``plugin.register``). The engine core starts after that, and the frontend only waits
    for it meanwhile: the first request then admits as fast as later ones, and a worker of
    its own finds the record in the store (``warm_when_served``) before its first request
    (#55). ``None`` (nothing started) where the engine applies no constraint of ours or the
    frontend holds no tokenizer (a constraint is refused at admission then), or not a fast
    Hugging Face one (Mistral's: the vocabulary would load another, which the first
    constrained request does instead, as before)."""
    from constrained.grammars.vocab import is_fast_hf
    from constrained.grammars.vocab_tables import build_admission_tables, one_table

    model_config = getattr(input_processor, "model_config", None)
    tokenizer = loaded_tokenizer(input_processor)
    if model_config is None or not is_fast_hf(tokenizer):
        return None
    applied, _ = engine_applies(model_config, getattr(input_processor, "vllm_config", None))
    if "json_schema" not in applied:  # (the grammar processor applies every constraint)
        return None
    width = int(model_config.get_vocab_size())

    def warm() -> None:
        lower_warm_up_priority()
        try:
            with one_table():  # the token bytes and the record
                vocab = served_vocab(model_config, width, tokenizer=tokenizer)
            build_admission_tables(vocab)
        except Exception:  # the first constrained request builds them, and reports what fails
            return

    return _warm_once((tokenizer_path(model_config), width, "admission"), warm)


def _warm_once(key: tuple[Any, ...], warm: Any) -> threading.Thread:
    """The warm-up thread of ``key``, started with ``warm`` unless one already was."""
    with _WARMING_LOCK:
        thread = _WARMING.get(key)
        if thread is None:
            thread = threading.Thread(target=warm, name="constrained-warm", daemon=True)
            thread.start()
            _WARMING[key] = thread
        return thread


def _record_of(model_config: Any, width: int, reads_tokenizer: bool) -> Any:
    """The store and the key of the served tokenizer's record, or ``None`` where none is read."""
    from constrained.grammars.vocab_record import record_key

    place = _records(model_config, reads_tokenizer)
    try:
        store = place.find_store() if place is not None else None
        key = record_key(tokenizer_path(model_config), width, None, place.parts) if store else None
    except Exception:  # (a config that names no tokenizer)
        return None
    return None if key is None else (store, key)


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
    any complete output we can find (``grammars/closing.py``). Without a thinking gate, the
    request's first row is kept for an engine whose compile is still running
    (``grammars/start_row.py``, ``keep_start_row``).

    Raises:
        OptionError: naming the constraint's field, when it does not compile in time;
            naming ``max_tokens`` when no complete output fits in it.
    """
    from constrained.grammars import GrammarError, compiler_for

    spec = spec_of(options)
    if spec is None:
        return
    vocab = served_vocab(model_config, tokenizer=tokenizer)
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
    if options.reasoning_end is None:  # (a thinking row waits for no compile)
        from constrained.grammars.start_row import keep_start_row

        keep_start_row(grammar, vocab, max_tokens, spec.kind)


def check_budget(grammar: Any, vocab: Any, kind: str, max_tokens: int, marker: int = 0) -> None:
    """Refuse a ``max_tokens`` no complete output of the constraint fits in (after the
    ``marker`` tokens that end thinking, when the request thinks first)."""
    from constrained.grammars.closing import ROOT_WITNESS_TOKENS
    from constrained.grammars.closing_tables import root_witness

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
        if current and entry.engine_is(self_at(caller, entry.depth)):
            entry.reraise()
            return
        owner, depth = find_input_processor(caller)
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
            raise copy_error(self.refusal)


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
            refusal=None if refusal is None else copy_error(refusal),
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


# Frontend: each request's admission outcome (``validate_at_admission``).
_admissions = RecentByIdentity(MEMO_SIZE)
