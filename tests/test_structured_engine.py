"""Structured output on the real vLLM engine: JSON schemas, regexes and grammars."""

from __future__ import annotations

import json
import math
import os
import re
import uuid

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

import constrained.settings
from constrained import OptionError, Options
from constrained.grammars.compiler import COMPILE_TIMEOUT_ENV

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["Person:", "The capital of France is", "{", "def f(x):"]


def generate(llm, n: int, max_tokens: int = 256, temperature: float = 1.0, **extra):
    params = [
        SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i, extra_args=extra)
        for i in range(n)
    ]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def outside_strings(text: str) -> str:
    """JSON text with every string literal emptied."""
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def assert_all_valid_json(outputs, schema) -> None:
    for out in outputs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar", "outlines"])
def test_json_schema_output_parses_and_validates(llm, backend):
    schema = PERSON
    if backend == "outlines":  # outlines-core does not enforce minimum / maximum
        schema = json.loads(json.dumps(PERSON))
        schema["properties"]["age"] = {"type": "integer"}
    outputs = generate(llm, 16, json_schema=schema, grammar_backend=backend)
    finished = [o for o in outputs if o.finish_reason == "stop"]
    # A random model can write an unbounded integer until max_tokens; bounded ones stop.
    assert len(finished) >= (8 if backend == "outlines" else 16)
    assert_all_valid_json(finished, schema)
    # Compact by default: not one whitespace character outside strings.
    for out in outputs:
        assert not re.search(r"\s", outside_strings(out.text)), out.text


SHAPE = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["circle", "square"]},
        "r": {"type": "integer", "minimum": 0, "maximum": 9},
        "side": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["kind"],
    "additionalProperties": False,
}
# One schema per keyword family no backend enforces as written (grammars/schema_rewrite.py).
REWRITTEN = {
    "if/then/else": {
        **SHAPE,
        "if": {"properties": {"kind": {"const": "circle"}}},
        "then": {"required": ["r"]},
        "else": {"required": ["side"], "not": {"required": ["r"]}},
    },
    "dependentRequired": {**SHAPE, "dependentRequired": {"r": ["side"]}},
    "dependencies": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        **SHAPE,
        "dependencies": {"side": ["r"], "r": {"properties": {"kind": {"const": "circle"}}}},
    },
    "not": {"type": "string", "maxLength": 4, "not": {"enum": ["", "a", "yes", "no"]}},
    "oneOf": {
        "type": "integer",
        "minimum": -9,
        "maximum": 20,
        "oneOf": [{"maximum": 10}, {"minimum": 5}],
    },
    "dependentSchemas": {
        **SHAPE,
        "dependentSchemas": {"side": {"properties": {"kind": {"const": "square"}}}},
    },
    "oneOf (disjoint)": {
        "oneOf": [
            {**SHAPE, "properties": {**SHAPE["properties"], "kind": {"const": "circle"}}},
            {**SHAPE, "properties": {**SHAPE["properties"], "kind": {"const": "square"}}},
        ]
    },
    "propertyNames": {
        "type": "object",
        "propertyNames": {"pattern": "^[a-c]$"},
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
        "maxProperties": 3,
    },
    "format": {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "json-pointer", "maxLength": 8},
            "up": {"type": "string", "format": "relative-json-pointer", "maxLength": 8},
        },
        "required": ["at", "up"],
        "additionalProperties": False,
    },
}
# RFC 6901 and the relative JSON pointer draft, written from their grammars: jsonschema
# checks these formats only with the optional jsonpointer package, not installed here.
JSON_POINTER = r"(/([^~/]|~[01])*)*"
RELATIVE_JSON_POINTER = r"(0|[1-9][0-9]*)(#|" + JSON_POINTER + ")"


CHECKED_ARRAYS = {
    "uniqueItems": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                     "uniqueItems": True, "minItems": 2, "maxItems": 4},
            "days": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3},
                     "uniqueItems": True, "minItems": 3},
            "level": {"type": "array", "items": {"enum": ["lo", "mid", "hi"]},
                      "uniqueItems": True, "minItems": 2},
        },
        "required": ["tags", "days", "level"],
        "additionalProperties": False,
    },
    "contains": {
        "type": "array",
        "items": {"enum": ["a", "b", "c"]},
        "contains": {"const": "c"},
        "minContains": 2,
        "maxContains": 3,
    },
}  # fmt: skip


# Keywords no backend enforces: rewritten (schema_rewrite.py) or checked (checked_matcher.py).
UNENFORCED = {**REWRITTEN, **CHECKED_ARRAYS}


@pytest.mark.parametrize("keyword", UNENFORCED)
def test_keywords_no_backend_enforces_are_enforced_in_generation(llm, keyword):
    schema = UNENFORCED[keyword]
    outputs = generate(llm, 12, max_tokens=96, json_schema=schema)
    finished = [o for o in outputs if o.finish_reason == "stop"]
    assert len(finished) >= 6, [o.text for o in outputs]
    assert_all_valid_json(finished, schema)
    if keyword == "format":
        for out in finished:
            value = json.loads(out.text)
            assert re.fullmatch(JSON_POINTER, value["at"], re.DOTALL), value
            assert re.fullmatch(RELATIVE_JSON_POINTER, value["up"], re.DOTALL), value


def test_schema_as_json_text_and_from_a_pydantic_model(llm):
    class Item(BaseModel):
        # Closed, as JSON Schema allows extra keys otherwise (a random model writes many).
        model_config = ConfigDict(extra="forbid")

        sku: str = Field(max_length=8)
        qty: int = Field(ge=1, le=99)

    schema = Item.model_json_schema()
    for given in (json.dumps(schema), Item):
        extra = Options(json_schema=given).to_extra_args()
        assert isinstance(extra["json_schema"], str)
        for out in generate(llm, 8, **extra):
            assert out.finish_reason == "stop"
            Item.model_validate_json(out.text)


def test_flexible_whitespace_is_capped(llm):
    outputs = generate(llm, 16, json_schema=PERSON, whitespace="flexible", max_whitespace=2)
    assert_all_valid_json(outputs, PERSON)
    for out in outputs:
        assert not re.search(r"\s{3,}", outside_strings(out.text)), out.text
        assert not re.match(r"\s", out.text)


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_disable_additional_properties_closes_open_objects(llm, backend):
    open_schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]}},
        "required": ["a"],
    }
    outputs = generate(
        llm, 12, json_schema=open_schema, grammar_backend=backend,
        disable_additional_properties=True,
    )  # fmt: skip
    assert_all_valid_json(outputs, open_schema)
    for out in outputs:
        assert set(json.loads(out.text)) <= {"a", "b"}


def test_regex_and_grammar_constrain_the_whole_output(llm):
    for out in generate(llm, 12, max_tokens=40, regex=r"[0-9]{3}-[a-z]{2,6}"):
        assert out.finish_reason == "stop"
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,6}", out.text), out.text
    gbnf = 'root ::= answer "!"\nanswer ::= "yes" | "no" | "maybe"'
    for backend in ("auto", "xgrammar", "llguidance"):
        for out in generate(llm, 8, max_tokens=20, grammar=gbnf, grammar_backend=backend):
            assert out.finish_reason == "stop"
            assert out.text in ("yes!", "no!", "maybe!")


def test_constrained_greedy_is_deterministic_and_stops(llm):
    a = generate(llm, 4, temperature=0.0, json_schema=PERSON)
    b = generate(llm, 4, temperature=0.0, json_schema=PERSON)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert_all_valid_json(a, PERSON)


def test_composes_with_penalties_bias_min_p_and_vllm_sampling(llm):
    params = [
        SamplingParams(
            temperature=t, top_k=k, top_p=p, seed=s, max_tokens=256,
            extra_args={"json_schema": PERSON, "repetition_penalty": 1.2,
                        "frequency_penalty": 0.5, "presence_penalty": 0.3,
                        "logit_bias": {"11": 5.0, "1": -5.0}, "min_p": 0.05},
        )
        for t, k, p, s in [(0.7, 20, 0.9, 1), (1.3, -1, 0.8, 2), (1.0, 5, 1, 3), (0.0, -1, 1, 4)]
    ]  # fmt: skip
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert_all_valid_json([o.outputs[0] for o in outs], PERSON)
    # Same seed, same request: same output, constrained or not in a batch of others.
    alone = llm.generate(PROMPTS[:1], params[:1], use_tqdm=False)
    assert alone[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_mixed_batch_leaves_unconstrained_rows_alone(llm):
    plain = SamplingParams(temperature=0.0, max_tokens=16)
    before = llm.generate(PROMPTS, [plain] * 4, use_tqdm=False)
    mixed = llm.generate(
        PROMPTS * 2,
        [plain] * 4 + [SamplingParams(temperature=0.0, max_tokens=64,
                                      extra_args={"regex": "[a-z]+"})] * 4,
        use_tqdm=False,
    )  # fmt: skip
    assert [o.outputs[0].token_ids for o in mixed[:4]] == [o.outputs[0].token_ids for o in before]
    for out in mixed[4:]:
        assert re.fullmatch("[a-z]+", out.outputs[0].text)


def test_ids_past_the_tokenizer_are_never_sampled(llm):
    # A +100 bias on an id past the tokenizer (151,665 tokens, 151,936 logits) and on a
    # special token: the mask still wins, the output still matches.
    bias = {"151900": 100.0, "151644": 100.0}
    for out in generate(llm, 8, max_tokens=30, regex="[a-z]{1,8}", logit_bias=bias):
        assert out.finish_reason == "stop"
        assert all(t < 151643 or t == 151643 for t in out.token_ids)
        assert re.fullmatch("[a-z]{1,8}", out.text)


def test_a_request_that_fails_midway_ends_cleanly(llm):
    # A bias of +100 forces ',' which the regex never allows: the mask wins, the output
    # still matches, and the engine keeps serving.
    out = generate(llm, 2, max_tokens=20, regex="[0-9]{2}", logit_bias={"11": 100.0})
    for o in out:
        assert re.fullmatch("[0-9]{2}", o.text)
    assert generate(llm, 1, max_tokens=4)[0].token_ids


DEEP = '{"type": "array", "items": ' * 300 + "{}" + "}" * 300
HUGE = {"type": "object", "properties": {f"p{i}": {"description": "x" * 500} for i in range(9000)}}
BAD_CONSTRAINTS = [
    ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
    ({"json_schema": {"type": "objekt"}}, "json_schema", "not a valid JSON schema"),
    ({"json_schema": 42}, "json_schema", "must be a JSON schema"),
    ({"json_schema": {"type": "string", "not": {"pattern": "^a"}}}, "json_schema", "'not'"),
    ({"json_schema": {"type": "array", "not": {"uniqueItems": True}}}, "json_schema",
     "uniqueItems"),
    ({"json_schema": {"allOf": [{"minimum": 1}, {"maximum": 3}]}, "grammar_backend": "xgrammar"},
     "json_schema", "allOf"),
    ({"json_schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}},
     "json_schema", "loop"),
    ({"json_schema": {"$ref": "#/$defs/missing"}}, "json_schema", "cannot be compiled"),
    ({"json_schema": DEEP}, "json_schema", "nested deeper"),
    ({"json_schema": HUGE}, "json_schema", "bytes, more than"),
    ({"regex": "[a-"}, "regex", "cannot be compiled"),
    ({"regex": "(?=a)a"}, "regex", "cannot be compiled"),
    ({"regex": ""}, "regex", "empty"),
    ({"grammar": "root ::= (("}, "grammar", "cannot be compiled"),
    ({"grammar": 'root ::= "a"', "grammar_backend": "outlines"}, "grammar_backend", "regex"),
    ({"regex": "a", "grammar": 'root ::= "a"'}, "grammar", "only one of"),
    ({"json_schema": {}, "regex": "a"}, "regex", "only one of"),
    ({"grammar_backend": "xgrammar"}, "grammar_backend", "no effect"),
    ({"grammar_backend": "guidance", "regex": "a"}, "grammar_backend", "llguidance"),
    ({"regex": "a", "whitespace": "flexible"}, "whitespace", "json_schema and structural_tag only"),
    ({"json_schema": {}, "max_whitespace": 2}, "max_whitespace", "flexible"),
    ({"regex": "a", "disable_additional_properties": True}, "disable_additional_properties",
     "json_schema and structural_tag only"),
    ({"json_schema": {"allOf": [{"type": "object"}]}, "disable_additional_properties": True},
     "json_schema", "allOf"),
    ({"json_schema": {}, "whitespace": "flexible", "max_whitespace": 99}, "max_whitespace", "16"),
]  # fmt: skip


@pytest.mark.parametrize(("extra_args", "field", "message"), BAD_CONSTRAINTS)
def test_bad_constraints_are_refused_naming_the_field(llm, extra_args, field, message):
    with pytest.raises(VLLMValidationError, match=f"'{field}'") as info:
        llm.generate(["hi"], SamplingParams(max_tokens=2, extra_args=extra_args), use_tqdm=False)
    cause = info.value.__cause__
    assert isinstance(cause, OptionError)
    assert cause.field == field
    assert message in str(cause)
    ok = generate(llm, 1, max_tokens=40, regex="[a-z]{1,5}")
    assert re.fullmatch("[a-z]{1,5}", ok[0].text)


def test_constraint_with_conflicting_vllm_settings_is_refused(llm):
    from vllm.sampling_params import StructuredOutputsParams

    for params in (
        SamplingParams(min_tokens=3, extra_args={"regex": "a"}),
        SamplingParams(allowed_token_ids=[64, 65], extra_args={"regex": "a"}),
        SamplingParams(bad_words=["a"], extra_args={"regex": "a"}),
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       extra_args={"regex": "a"}),
    ):  # fmt: skip
        with pytest.raises(VLLMValidationError, match=r"'regex'.*cannot be combined"):
            llm.generate(["hi"], params, use_tqdm=False)


def test_a_compile_over_the_time_limit_is_refused(llm, monkeypatch):
    monkeypatch.setenv(COMPILE_TIMEOUT_ENV, "0.001")
    constrained.settings.reset()
    tag = uuid.uuid4().hex  # a schema no cache has seen, big enough to take milliseconds
    fresh = {
        "type": "object",
        "properties": {f"k{tag}{i}": {"type": "string", "pattern": f"[a-z]{{{i}}}x"}
                       for i in range(1, 200)},
        "required": [f"k{tag}1"],
    }  # fmt: skip
    with pytest.raises(VLLMValidationError, match=r"'json_schema'.*longer than") as info:
        llm.generate(["hi"], SamplingParams(extra_args={"json_schema": fresh}), use_tqdm=False)
    assert isinstance(info.value.__cause__, OptionError)
    monkeypatch.delenv(COMPILE_TIMEOUT_ENV)
    constrained.settings.reset()
    # Without the limit the same schema is served.
    for out in generate(llm, 2, max_tokens=64, json_schema=fresh):
        assert out.text.startswith('{"k')


def test_numbers_stay_doubles_when_the_model_pushes_exponents(llm):
    """Pulled toward ``1``, ``e`` and ``9``, a model would write ``1e999``, which parsers read
    as infinity (and vLLM's tool parsers write back as ``Infinity``, not JSON): every number
    written stays finite, and the output still ends with ``stop``."""
    tokenizer = llm.get_tokenizer()
    bias = {str(tokenizer.encode(t, add_special_tokens=False)[0]): 12.0 for t in "1e9"}
    schema = {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 6}
    outs = generate(llm, 4, max_tokens=96, json_schema=schema, logit_bias=bias)
    assert_all_valid_json(outs, schema)
    for out in outs:
        assert all(math.isfinite(x) for x in json.loads(out.text)), out.text
    assert any(re.search(r"\de\+?9", out.text) for out in outs)  # the rule was reached


def test_tool_call_tags_keep_numbers_doubles(llm):
    """The same inside a structural tag, the form vLLM's hermes parser asks tool calls in:
    the arguments' numbers stay finite; the tag's literal text is written as it is."""
    tokenizer = llm.get_tokenizer()
    bias = {str(tokenizer.encode(t, add_special_tokens=False)[0]): 12.0 for t in "1e9"}
    arguments = {"type": "object", "properties": {"x": {"type": "number"}},
                 "required": ["x"], "additionalProperties": False}  # fmt: skip
    tag = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": True,
        "stop_after_first": True, "tags": [{
            "type": "tag", "begin": '<tool_call>\n{"name": "f", "arguments": ',
            "content": {"type": "json_schema", "json_schema": arguments},
            "end": "}\n</tool_call>"}]}}  # fmt: skip
    outs = generate(llm, 4, max_tokens=96, structural_tag=json.dumps(tag), logit_bias=bias)
    reached = False
    for out in outs:
        assert out.finish_reason == "stop", out.text
        text = tokenizer.decode(out.token_ids, skip_special_tokens=False)  # <tool_call> kept
        call = re.search(
            r'<tool_call>\n(\{"name": "f", "arguments": .*\})\n</tool_call>', text, re.S
        )
        assert call, text
        value = json.loads(call.group(1))["arguments"]["x"]
        assert math.isfinite(value), text
        reached |= bool(re.search(r"\de\+?9", call.group(1)))
    assert reached  # the rule was reached


def _thread_cpus(pid: int) -> dict[int, set[int]]:
    """Each thread of process ``pid`` and the CPUs it may run on (Linux takes a thread id)."""
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_our_threads_in_the_pinned_worker_run_off_its_compute_core(llm):
    """vLLM's CPU worker binds itself to its compute core (automatic binding: one of this
    machine's two); the mask fill, compile, warm-up and llguidance pool threads it starts for
    us run on the core the binding left out (``helper_cpus``)."""
    import psutil

    from constrained.helper_cpus import numa_nodes, spare_cpus

    generate(llm, 4, max_tokens=24, json_schema=PERSON)
    # This engine's own worker (other tests' servers may still be up beside it).
    (core,) = llm.llm_engine.engine_core.resources.engine_manager.processes
    workers = [p for p in psutil.Process(core.pid).children() if "Worker" in p.name()]
    assert len(workers) == 1, [p.name() for p in workers]
    threads = _thread_cpus(workers[0].pid)
    pinned = threads[workers[0].pid]  # its main thread: vLLM's binding
    spare = spare_cpus(pinned, numa_nodes(), os.sched_getaffinity(workers[0].ppid()))
    assert spare, f"vLLM bound the worker to {pinned}: no spare CPU here"
    off = [tid for tid, cpus in threads.items() if not cpus & pinned]
    assert len(off) >= 2, threads  # the fill thread and llguidance's pool at least
    assert all(threads[tid] == spare for tid in off)


def test_the_frontend_warms_admission_while_the_engine_starts(llm):
    # Our vllm.general_plugins entry point, as vLLM loads it: its InputProcessor, built before
    # the engine core, started the frontend's warm-up (the only caller of warm_admission is
    # that hook; what it builds is tests/test_warm_up.py's).
    from constrained import admission
    from constrained.grammars.vocab import is_loaded

    config = llm.llm_engine.model_config
    path, width = admission.tokenizer_path(config), config.get_vocab_size()
    thread = admission._WARMING[(path, width, "admission")]
    thread.join(timeout=120)
    assert not thread.is_alive() and is_loaded(path, width)
    out = generate(llm, 1, max_tokens=64, json_schema=PERSON)[0]
    assert out.finish_reason == "stop" and jsonschema.validate(json.loads(out.text), PERSON) is None
