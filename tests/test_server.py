"""The OpenAI-compatible server started by our launcher, driven by the `openai` client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from constrained import Options


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def complete(client: openai.OpenAI, xargs: dict | None = None, **kwargs):
    body = {"vllm_xargs": xargs} if xargs is not None else None
    kwargs = {"max_tokens": 8, "temperature": 1.0, "seed": 0, **kwargs}
    return client.completions.create(model="tiny", prompt="Hello", extra_body=body, **kwargs)


def test_logit_bias_as_json_string_in_vllm_xargs(client):
    xargs = Options(logit_bias={11: 100.0}).to_vllm_xargs()
    assert isinstance(xargs["logit_bias"], str)
    out = complete(client, xargs, max_tokens=6)
    assert out.choices[0].text == "," * 6


def test_chat_with_min_p_one_equals_greedy(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    greedy = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0.0
    )
    min_p = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=10,
        temperature=1.0,
        seed=4,
        extra_body={"vllm_xargs": {"min_p": 1.0}},
    )
    assert min_p.choices[0].message.content == greedy.choices[0].message.content


def test_our_options_match_the_servers_builtin_ones(client):
    bias = {"11": 4.0, "13": 6.0, "220": -3.0}
    builtin = complete(client, None, max_tokens=16, logit_bias=bias)
    ours = complete(client, {"logit_bias": json.dumps(bias)}, max_tokens=16)
    assert ours.choices[0].text == builtin.choices[0].text


@pytest.mark.parametrize(
    ("xargs", "field"),
    [
        ({"min_p": 2.0}, "min_p"),
        ({"min_p": "high"}, "min_p"),
        ({"logit_bias": "{not json"}, "logit_bias"),
        ({"logit_bias": '{"999999999": 1}'}, "logit_bias"),
        ({"logit_bias": '{"5": "strong"}'}, "logit_bias"),
        ({"min_pp": 0.1}, "min_pp"),
        ({"top_n_sigma": 0}, "top_n_sigma"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"xtc_probability": 0.5, "xtc_threshold": 0.7}, "xtc_threshold"),
        ({"xtc_threshold": 0.1}, "xtc_threshold"),
    ],
)
def test_bad_options_get_400_naming_the_field_then_good_requests_succeed(client, xargs, field):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, xargs)
    assert info.value.status_code == 400
    assert f"'{field}'" in str(info.value)
    assert complete(client, {"min_p": 0.1}).choices[0].text is not None


def test_samplers_in_vllm_xargs(client):
    """XTC over HTTP: A, B, C all qualify, so every step leaves C (see test_samplers_engine)."""
    bias = json.dumps({"11": 30.0, "12": 28.0, "13": 26.0})
    xargs = {"logit_bias": bias, "xtc_probability": 1.0, "xtc_threshold": 0.001}
    out = complete(client, xargs, max_tokens=6, temperature=0.05)
    assert out.choices[0].text == "." * 6
    plain = complete(client, {"logit_bias": bias}, max_tokens=6, temperature=0.05)
    assert plain.choices[0].text == "," * 6
    both = {"top_n_sigma": 1.5, "typical_p": 0.9, "xtc_probability": 0.3}
    assert complete(client, both, max_tokens=6).choices[0].text is not None


def test_builtin_twin_is_refused_over_http(server):
    body = {
        "model": "tiny",
        "prompt": "Hi",
        "max_tokens": 4,
        "min_p": 0.2,
        "vllm_xargs": {"min_p": 0.2},
    }
    resp = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 400
    assert "'min_p'" in resp.text and "built-in" in resp.text


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
def test_json_schema_in_vllm_xargs_chat_and_completions(client, backend):
    import jsonschema

    xargs = Options(json_schema=PERSON, grammar_backend=backend).to_vllm_xargs()
    assert isinstance(xargs["json_schema"], str)  # vllm_xargs cannot carry objects
    for seed in range(4):
        chat = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A person, as JSON."}],
            max_tokens=128,
            temperature=1.0,
            seed=seed,
            extra_body={"vllm_xargs": xargs},
        )
        choice = chat.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        text = complete(client, xargs, max_tokens=128, seed=seed).choices[0].text
        jsonschema.validate(json.loads(text), PERSON)


def test_regex_streams_and_stops(client):
    stream = client.completions.create(
        model="tiny",
        prompt="Code:",
        max_tokens=32,
        temperature=1.0,
        stream=True,
        extra_body={"vllm_xargs": {"regex": "[A-Z]{2}-[0-9]{3}"}},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len(text) == 6 and text[2] == "-" and text[:2].isupper() and text[3:].isdigit()


@pytest.mark.parametrize(
    ("xargs", "field"),
    [
        ({"json_schema": "{not json"}, "json_schema"),
        ({"json_schema": '{"type": "array", "not": {"uniqueItems": true}}'}, "json_schema"),
        ({"json_schema": '{"type": 12}'}, "json_schema"),
        ({"regex": "(unclosed"}, "regex"),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"regex": "a", "json_schema": "{}"}, "regex"),
        ({"grammar_backend": "fast", "regex": "a"}, "grammar_backend"),
        ({"json_schema": "{}", "whitespace": "lots"}, "whitespace"),
    ],
)
def test_bad_constraints_get_400_naming_the_field(client, xargs, field):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, xargs)
    assert info.value.status_code == 400
    assert f"'{field}'" in str(info.value)
    assert complete(client, {"regex": "[a-z]{3}"}, max_tokens=10).choices[0].text.isalpha()


def test_engine_loads_what_admission_compiled(client, served):
    """Compile once: the API process compiles each new constraint at admission (in a worker
    thread, via the middleware) and saves it; the engine process loads it, compiles nothing.
    xgrammar's quick compiles are not stored (cheaper to repeat): its request here uses a
    MaskBench schema that takes about a second to compile."""
    from tests.soak import MASKBENCH, SLOW_XGRAMMAR, engine_snapshot

    slow = json.loads((MASKBENCH / SLOW_XGRAMMAR).read_text())["schema"]
    array = json.dumps({"type": "array", "items": {"const": "x"}, "maxItems": 2})
    fresh = [
        ({"json_schema": array, "grammar_backend": "llguidance"}, False),
        ({"json_schema": json.dumps(slow), "grammar_backend": "xgrammar"}, True),
        ({"json_schema": array, "grammar_backend": "outlines"}, False),
        ({"regex": r"z{1,3}q"}, True),
    ]
    before = engine_snapshot(served)["compile_cache"]
    for xargs, stream in fresh:  # 16 tokens, cut there: the slow schema needs more to close
        xargs = {**xargs, "close_at_max_tokens": False}
        response = complete(client, xargs, max_tokens=16, stream=stream)
        chunks = list(response) if stream else [response]
        assert chunks[-1].choices[0].finish_reason in ("stop", "length"), xargs
    snapshot = engine_snapshot(served)
    after = snapshot["compile_cache"]
    assert after["compiled"] == before["compiled"], (before, after)
    assert after["loaded"] == before["loaded"] + len(fresh), (before, after)
    # The worker (a process of its own on CPU) built its vocabulary from the tokenizer's
    # record that admission saved, without loading the tokenizer (grammars/vocab_record.py).
    assert snapshot["vocab_from_record"] is True
