"""``close_at_max_tokens`` on the real vLLM engine (V1, CPU build): constrained outputs finish,
complete and valid, by ``max_tokens``; a budget too small is refused naming ``max_tokens``;
the server does the same, streaming included, and under preemption.

The V2 side runs on vLLM's real V2 sampler (``test_v2_real_sampler.py::test_budget_closing``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import jsonschema
import openai
import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from tests.bad_requests import THREE_STRINGS
from tests.soak import MASKBENCH, preemptions
from tests.test_budget_closing import PERSON


def maskbench_schemas(count: int, seed: int = 3) -> list[dict]:
    """``count`` MaskBench schemas, the same every run (read from ../shared/data)."""
    files = sorted(MASKBENCH.glob("*.json"))
    random.Random(seed).shuffle(files)
    schemas = []
    for path in files[: count * 2]:
        document = json.loads(path.read_text())
        schemas.append(document.get("schema", document))
    return schemas[:count]


def run(llm, schema: dict, max_tokens: int, seed: int, close: bool = True):
    extra = {"json_schema": schema}
    if not close:
        extra["close_at_max_tokens"] = False
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, extra_args=extra)
    return llm.generate(["Answer in JSON:"], params, use_tqdm=False)[0].outputs[0]


@pytest.mark.parametrize("max_tokens", [32, 64])
def test_maskbench_outputs_finish_valid_by_max_tokens(llm, max_tokens):
    """Every output parses and validates (finish_reason "stop", within max_tokens), or the
    request is refused naming max_tokens; without closing, the same budgets cut outputs."""
    valid, refused, cut_without = 0, 0, 0
    for i, schema in enumerate(maskbench_schemas(24)):
        try:
            out = run(llm, schema, max_tokens, seed=i)
        except VLLMValidationError as exc:
            message = str(exc)
            if "'max_tokens'" in message:
                refused += 1
                continue
            assert "'json_schema'" in message, message  # a schema no backend enforces
            continue
        assert out.finish_reason == "stop", (max_tokens, out.text)
        assert len(out.token_ids) <= max_tokens
        jsonschema.validate(json.loads(out.text), schema)
        valid += 1
        cut_without += run(llm, schema, max_tokens, seed=i, close=False).finish_reason == "length"
    assert valid >= 12, (valid, refused)
    assert cut_without >= 3, cut_without  # the budgets bite: closing is what finished them


def test_closing_outputs_use_the_budget_and_validate(llm):
    """A schema with required nested content at a budget just above its shortest output."""
    for seed in range(6):
        out = run(llm, PERSON, 56, seed)
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)


def test_a_budget_below_the_shortest_output_is_refused_naming_max_tokens(llm):
    schema = json.loads(THREE_STRINGS)
    with pytest.raises(VLLMValidationError, match=r"'max_tokens'.*is 3.*at least \d+"):
        run(llm, schema, 3, seed=0)
    out = run(llm, schema, 3, seed=0, close=False)  # the option turns the check off
    assert out.finish_reason == "length"
    out = run(llm, schema, 40, seed=0)  # and the engine serves on
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), schema)


def test_regex_and_grammar_close_too(llm):
    for extra, check in (
        ({"regex": "[a-z]+@[a-z]+\\.(com|org)"}, r"^[a-z]+@[a-z]+\.(com|org)$"),
        (
            {"grammar": 'root ::= "[" ("a" | "bb") ("," ("a" | "bb"))* "]"'},
            r"^\[(a|bb)(,(a|bb))*\]$",
        ),
    ):
        params = [
            SamplingParams(temperature=1.0, seed=s, max_tokens=12, extra_args=extra)
            for s in range(8)
        ]
        outs = [o.outputs[0] for o in llm.generate(["x"] * 8, params, use_tqdm=False)]
        for out in outs:
            assert out.finish_reason == "stop", (extra, out.text)
            assert re.match(check, out.text), out.text


# ---- served ------------------------------------------------------------------------------


def test_server_refuses_a_small_budget_with_400_streaming_too(server):
    for stream in (False, True):
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 3, "stream": stream,
                "vllm_xargs": {"json_schema": THREE_STRINGS}}  # fmt: skip
        resp = httpx.post(server + "/v1/completions", json=body, timeout=120)
        assert resp.status_code == 400, resp.text[:300]
        assert "'max_tokens'" in resp.json()["error"]["message"]


def test_server_chat_closes_at_max_tokens(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")
    for seed in range(3):
        resp = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A person, as JSON"}],
            max_tokens=56,
            temperature=1.0,
            seed=seed,
            extra_body={"vllm_xargs": {"json_schema": json.dumps(PERSON)}},
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_server_without_max_tokens_takes_the_remaining_context_as_the_budget(server):
    """A chat request with no ``max_tokens``: vLLM gives it the model's remaining context
    (the session server's 512 tokens less the prompt), and that is the budget closing keeps
    to; a prompt that leaves less than the shortest output is refused naming ``max_tokens``."""
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")

    def ask(words: int, **extra):
        return client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A person, as JSON:" + " a" * words}],
            temperature=1.0,
            seed=0,
            **extra,
        )

    # Each " a" is one token: measure the prompt once, then leave 60 tokens of context.
    base = ask(0, max_tokens=1).usage.prompt_tokens
    words = 512 - 60 - base
    resp = ask(words, extra_body={"vllm_xargs": {"json_schema": json.dumps(PERSON)}})
    assert resp.usage.prompt_tokens == base + words, resp.usage
    choice = resp.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert resp.usage.completion_tokens <= 60, resp.usage
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    with pytest.raises(openai.BadRequestError, match="'max_tokens'"):
        ask(512 - 3 - base, extra_body={"vllm_xargs": {"json_schema": json.dumps(PERSON)}})


def test_server_closes_under_preemption(server):
    """64 concurrent requests on the session server's 24-block KV cache, prompts just under
    one 128-token block: as outputs grow into a second block vLLM preempts some mid-output
    (and resumes them), and every output still finishes valid."""
    client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="none", timeout=600)
    before = preemptions(server)
    prompt = list(range(1000, 1118))  # token ids

    async def one(_: int):  # unseeded: vLLM's CPU build fails seeded chunked prefills
        return await client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=56,
            temperature=1.0,
            extra_body={"vllm_xargs": {"json_schema": json.dumps(PERSON)}},
        )

    async def all_of():
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(all_of())
    assert preemptions(server) > before, "the load did not preempt any request"
    for resp in results:
        choice = resp.choices[0]
        assert choice.finish_reason == "stop", choice.text
        jsonschema.validate(json.loads(choice.text), PERSON)
