"""Admission runs once per request, though vLLM calls ``validate_params`` once per class.

Drives vLLM's own admission (``InputProcessor._validate_params``, which calls each registered
class's ``validate_params`` in turn) with every processor of ``constrained.LOGITS_PROCESSORS``
registered, and counts what ``constrained.admission`` does: the stack walk that finds vLLM's
``InputProcessor`` and the admission body (``prepare_request``, parse, registration check,
compile) run once per request; the other calls answer from the first one's outcome. No
engine is started.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

import constrained
from constrained import admission, request_options
from constrained.engine_processors import resolve_processor
from constrained.frontend import AdmissionUnavailable
from constrained.options import OptionError

CLASSES = [resolve_processor(entry) for entry in constrained.LOGITS_PROCESSORS]
# One option of every processor, and a constraint (so admission compiles).
EVERYTHING = {
    "logit_bias": {"11": 3.0},
    "penalty_last_n": 8,
    "dry_multiplier": 0.8,
    "regex": "[0-9]{3}",
    "min_p": 0.1,
    "no_repeat_ngram_size": 3,
    "top_n_sigma": 1.0,
    "typical_p": 0.9,
    "xtc_probability": 0.5,
}


@pytest.fixture(scope="module")
def engine_config(tiny_model_dir):
    from vllm.engine.arg_utils import EngineArgs

    from constrained.demo import engine_kwargs

    return EngineArgs(
        model=tiny_model_dir, logits_processors=list(constrained.LOGITS_PROCESSORS),
        **engine_kwargs(),
    ).create_engine_config()  # fmt: skip


@pytest.fixture(scope="module")
def renderer(engine_config):
    from vllm.v1.engine.input_processor import InputProcessor

    return InputProcessor(engine_config).renderer


@pytest.fixture
def frontend(engine_config, renderer):
    """A fresh ``InputProcessor`` (vLLM's frontend) with every processor registered."""
    from vllm.v1.engine.input_processor import InputProcessor

    engine_config.model_config.logits_processors = list(constrained.LOGITS_PROCESSORS)
    return InputProcessor(engine_config, renderer)


@pytest.fixture
def counts(monkeypatch):
    """How often each step of admission ran."""
    seen = {"validate_params": 0, "walk": 0, "admit": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        admission,
        "validate_at_admission",
        counting("validate_params", admission.validate_at_admission),
    )
    monkeypatch.setattr(
        "constrained.processors.base.validate_at_admission", admission.validate_at_admission
    )
    monkeypatch.setattr(
        admission, "find_input_processor", counting("walk", admission.find_input_processor)
    )
    monkeypatch.setattr(admission, "_admit_once", counting("admit", admission._admit_once))
    return seen


def admit(frontend, params):
    """vLLM's own admission of ``params`` (every registered class's ``validate_params``)."""
    frontend._validate_params(params, ("generate",))


def each_class(self, params):
    """Call every class's ``validate_params``, each on its own (vLLM stops at the first
    refusal); ``self`` is vLLM's ``InputProcessor``, found on the stack as in vLLM."""
    errors = []
    for cls in CLASSES:
        with pytest.raises(OptionError) as info:
            cls.validate_params(params)
        errors.append(info.value)
    return errors


def test_one_admission_per_request(frontend, counts):
    assert len(CLASSES) == 9
    params = SamplingParams(extra_args=dict(EVERYTHING), max_tokens=16)
    admit(frontend, params)
    assert counts == {"validate_params": 9, "walk": 1, "admit": 1}

    # The same params object again (LLM.generate: one SamplingParams for every prompt):
    # the same verdict, without a second admission.
    admit(frontend, params)
    assert counts == {"validate_params": 18, "walk": 1, "admit": 1}

    # Another request: its own admission.
    admit(frontend, SamplingParams(extra_args=dict(EVERYTHING), max_tokens=16))
    assert counts == {"validate_params": 27, "walk": 2, "admit": 2}


def test_a_request_without_our_options_is_a_fast_exit(frontend, counts, monkeypatch):
    """No key of ours, nor one nobody may read: no stack walk, no admission, nothing
    remembered."""
    remembered = len(admission._admissions._items)
    for extra in (None, {}, {"kv_transfer_params": {"a": 1}}, {"session_id": "s"}):
        admit(frontend, SamplingParams(extra_args=extra, max_tokens=16))
    assert counts == {"validate_params": 36, "walk": 0, "admit": 0}
    assert len(admission._admissions._items) == remembered
    # A near miss of ours is still admitted, and refused.
    with pytest.raises(VLLMValidationError, match="Did you mean 'min_p'"):
        admit(frontend, SamplingParams(extra_args={"min-p": 0.1}))
    assert counts["admit"] == 1


def test_what_needs_admission(monkeypatch):
    from types import SimpleNamespace

    from constrained.settings import reset

    def request(extra_args=None, structured_outputs=None):
        return SimpleNamespace(extra_args=extra_args, structured_outputs=structured_outputs)

    assert request_options.nothing_to_admit(request())
    assert request_options.nothing_to_admit(request({"session_id": "s", "kv_transfer_params": {}}))
    assert request_options.nothing_to_admit(request(structured_outputs=object()))  # vLLM's own
    assert not request_options.nothing_to_admit(request({"min_p": 0.1}))
    assert not request_options.nothing_to_admit(request({"ngram_size": 3}))  # an alias of ours
    assert not request_options.nothing_to_admit(request({"regx": "a"}))  # a near miss
    # Another key: whether a processor of the engine reads it is decided at admission.
    assert not request_options.nothing_to_admit(request({"other_plugin_scale": 1}))
    # The engine side parses only requests with options of ours.
    assert not request_options.uses_our_options({"other_plugin_scale": 1, "session_id": "s"})
    assert request_options.uses_our_options({"other_plugin_scale": 1, "ngram_size": 3})
    monkeypatch.setenv("CONSTRAINED_UNKNOWN_EXTRA_ARGS", "pass")
    reset()
    try:  # passed whoever reads them: near misses of ours only
        assert request_options.nothing_to_admit(request({"other_plugin_scale": 1}))
        assert not request_options.nothing_to_admit(request({"regx": "a"}))
    finally:
        monkeypatch.undo()
        reset()
    monkeypatch.setenv("CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS", "1")  # our launcher
    monkeypatch.setenv("CONSTRAINED_UNKNOWN_EXTRA_ARGS", "refuse")
    monkeypatch.setenv("CONSTRAINED_ALLOWED_EXTRA_ARGS", "other_plugin_scale")
    reset()
    try:
        assert not request_options.nothing_to_admit(request(structured_outputs=object()))
        assert not request_options.nothing_to_admit(request({"unknown_key": 1}))
        assert request_options.nothing_to_admit(request({"other_plugin_scale": 1}))
    finally:
        monkeypatch.undo()
        reset()
    assert not request_options.keys_need_admission({"session_id": "s"})
    assert request_options.keys_need_admission({"other_plugin_scale": 1})
    assert request_options.keys_need_admission({"session_id": "s", "typical_p": 0.9})


def test_a_refusal_is_raised_by_every_call(frontend, counts):
    params = SamplingParams(extra_args={"regex": "[0-9]{3}", "regx": "a"})
    errors = each_class(frontend, params)
    assert len({str(error) for error in errors}) == 1, errors
    assert "invalid option 'regx'" in str(errors[0]) and "Did you mean 'regex'" in str(errors[0])
    assert {error.field for error in errors} == {"regx"}
    assert len({id(error) for error in errors}) == len(errors)  # a new exception each time
    assert counts == {"validate_params": 9, "walk": 1, "admit": 1}

    # Each request sharing the params object is refused, with the same message.
    for _ in range(3):
        with pytest.raises(VLLMValidationError) as info:
            admit(frontend, params)
        assert str(info.value) == str(errors[0])
    assert counts["admit"] == 1


def test_a_refused_constraint_compiles_once(frontend, counts):
    params = SamplingParams(extra_args={"regex": "[0-9"})
    errors = each_class(frontend, params)
    assert len({str(error) for error in errors}) == 1
    assert "invalid option 'regex'" in str(errors[0])
    assert counts["admit"] == 1


def test_what_admission_writes_is_the_same_request(frontend, counts, monkeypatch):
    """``prepare_request`` writes into the params: the 2nd..9th call still match."""
    from constrained import reasoning_parser

    monkeypatch.setattr(
        reasoning_parser, "thinking_ends", lambda *_: reasoning_parser.ThinkingEnds(marker="11")
    )
    params = SamplingParams(extra_args={"regex": "[0-9]{3}"}, max_tokens=16)
    admit(frontend, params)
    assert params.extra_args["reasoning_end"] == "11"  # written by admission
    assert counts == {"validate_params": 9, "walk": 1, "admit": 1}


def test_a_changed_params_object_is_admitted_anew(frontend, counts):
    params = SamplingParams(extra_args={"regex": "[0-9]{3}"}, max_tokens=16)
    admit(frontend, params)
    params.extra_args["regex"] = "[0-9"  # in place: the same dict, the same params object
    with pytest.raises(VLLMValidationError, match="invalid option 'regex'"):
        admit(frontend, params)
    params.extra_args = {"regex": "[0-9]{3}"}
    admit(frontend, params)
    params.max_tokens = 2  # too few for three digits and end-of-sequence
    with pytest.raises(VLLMValidationError, match="invalid option 'max_tokens'"):
        admit(frontend, params)
    assert counts["admit"] == 4


def test_another_engine_admits_anew(engine_config, renderer, frontend, counts):
    """vLLM lets one params object be shared across engines: each engine decides."""
    from vllm.v1.engine.input_processor import InputProcessor

    params = SamplingParams(extra_args={"regex": "[0-9]{3}"})
    admit(frontend, params)
    without_grammar = [e for e in constrained.LOGITS_PROCESSORS if "GrammarMask" not in e]
    engine_config.model_config.logits_processors = without_grammar
    other = InputProcessor(engine_config, renderer)
    with pytest.raises(VLLMValidationError, match="not registered"):
        admit(other, params)
    assert counts["admit"] == 2


def test_settings_reset_admits_anew(frontend, counts):
    from constrained.settings import reset

    params = SamplingParams(extra_args={"regex": "[0-9]{3}"})
    admit(frontend, params)
    reset()
    admit(frontend, params)
    assert counts["admit"] == 2


def test_a_compile_out_of_time_is_tried_again(frontend, counts, monkeypatch):
    from constrained.grammars.compiler import COMPILE_TIMEOUT_ENV

    def too_slow(params, owner):
        raise OptionError(
            "regex", f"xgrammar: compiling took longer than 1 s ({COMPILE_TIMEOUT_ENV})"
        )

    monkeypatch.setattr(admission, "_admit_once", too_slow)
    params = SamplingParams(extra_args={"regex": "[0-9]{3}"})
    errors = each_class(frontend, params)
    assert len({str(error) for error in errors}) == 1
    assert counts["walk"] == len(CLASSES)  # no outcome remembered: each call admits


def test_outside_vllm_admission_still_fails_loudly(frontend):
    params = SamplingParams(extra_args={"regex": "[0-9]{3}"})
    admit(frontend, params)  # admitted: remembered for this params object and engine
    with pytest.raises(AdmissionUnavailable):
        CLASSES[0].validate_params(params)


def test_the_engine_parses_once_per_request(monkeypatch):
    parses = []
    real = request_options.options_from_params
    monkeypatch.setattr(
        request_options, "options_from_params", lambda *a, **k: parses.append(1) or real(*a, **k)
    )
    params = SamplingParams(extra_args={"regex": "[0-9]{3}", "min_p": 0.1})
    for _ in CLASSES:
        options = request_options.options_for_engine(params, 512)
        assert options is not None and options.min_p == 0.1
    assert len(parses) == 1
    request_options.options_for_engine(params, 256)  # another width: parsed again
    assert len(parses) == 2
    bad = SamplingParams(extra_args={"regex": "a", "regx": "a"})
    messages = set()
    for _ in CLASSES:
        with pytest.raises(OptionError) as info:
            request_options.options_for_engine(bad, 512)
        messages.add(str(info.value))
    assert len(messages) == 1 and len(parses) == 3


def test_memo_is_bounded_and_by_identity():
    memo = request_options.RecentByIdentity(2)
    a, b, c = object(), object(), object()
    memo.put(a, "a")
    memo.put(b, "b")
    assert memo.get(a) == "a"  # a is now the most recent
    memo.put(c, "c")
    assert (memo.get(a), memo.get(b), memo.get(c)) == ("a", None, "c")
    memo.discard(a)
    assert memo.get(a) is None


MASKBENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"


def test_the_engine_does_not_check_an_admitted_schema_again(monkeypatch):
    """Admission checks a schema (meta-schema, ``$ref`` loops, no instance) and refuses it
    there; the engine's parse of the admitted request gives the same options without
    checking again (10 ms a new schema on the engine's step), for a ``json_schema`` and for
    the schemas inside a ``structural_tag``, over a sample of MaskBench."""
    from constrained.schema import user_input

    checked = []
    real = user_input._check_meta_schema
    monkeypatch.setattr(user_input, "_check_meta_schema", lambda v: checked.append(1) or real(v))
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "begin": "<tool_call>",
                    "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
                    "end": "</tool_call>",
                }
            ],
        },
    }
    files = sorted(MASKBENCH.glob("*.json"))[::97][:30]
    assert len(files) == 30
    schemas = [json.loads(f.read_text())["schema"] for f in files]
    requests = [{"json_schema": schema} for schema in schemas] + [{"structural_tag": tag}]
    for extra in requests:
        user_input._checked.cache_clear()
        params = SamplingParams(extra_args=extra)
        try:
            admitted = request_options.options_from_params(params, logits_width=512)
        except OptionError:
            continue  # refused at admission: the engine never sees it
        before = len(checked)
        assert before > 0
        user_input._checked.cache_clear()
        assert request_options.options_for_engine(params, 512) == admitted
        assert len(checked) == before  # no check in the engine
