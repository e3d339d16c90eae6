"""Every malformed request of ``tests/bad_requests.py`` is refused naming its field, and the
engine keeps serving: HTTP 400 from our server (then a good request succeeds), a ``ValueError``
from the offline API (vLLM 0.32 raises its ``VLLMValidationError`` with ours as the cause;
then a good request succeeds)."""

from __future__ import annotations

import json

import httpx
import pytest

from constrained.grammars.regex_size import regex_size, regex_size_problem
from tests.bad_requests import CORPUS, Bad

GOOD_XARGS = {"regex": "[a-z]{3}", "min_p": 0.1}
# Generous: a refusal takes milliseconds, the good request a fraction of a second. A hung
# request fails the test through the client's time-out instead of blocking the run.
HTTP_TIMEOUT_S = 120


def test_corpus_has_40_distinct_cases():
    assert len({case.id for case in CORPUS}) == len(CORPUS) >= 40


def _body(case: Bad) -> dict:
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "vllm_xargs": case.xargs}
    for key, value in case.builtin.items():
        body[key] = {"json": value} if key == "structured_outputs" else value
    return body


def _post(server: str, body: dict) -> httpx.Response:
    # json.dumps writes NaN / Infinity (what a careless client sends); httpx's json= refuses.
    return httpx.post(
        server + "/v1/completions",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=HTTP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def http(server: str):
    return server


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_server_refuses_with_400_naming_the_field(http, case):
    resp = _post(http, _body(case))
    assert resp.status_code == 400, resp.text[:500]
    assert f"'{case.field}'" in resp.json()["error"]["message"]
    good = _post(http, {"model": "tiny", "prompt": "Hi", "max_tokens": 6, "temperature": 1.0,
                        "vllm_xargs": GOOD_XARGS})  # fmt: skip
    assert good.status_code == 200, good.text[:500]
    choice = good.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and len(choice["text"]) == 3


@pytest.mark.parametrize("case", [c for c in CORPUS if not c.builtin], ids=lambda c: c.id)
def test_streaming_request_is_refused_with_400_before_the_stream(http, case):
    """Our launcher's middleware checks streaming requests first (vLLM would answer 200 and
    put the error in the event stream). Conflicts with vLLM's own fields are left to the
    engine's check, which reports them inside the stream."""
    resp = _post(http, {**_body(case), "stream": True})
    assert resp.status_code == 400, resp.text[:500]
    assert f"'{case.field}'" in resp.json()["error"]["message"]


def _sampling_params(case: Bad):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    builtin = dict(case.builtin)
    if "structured_outputs" in builtin:
        builtin["structured_outputs"] = StructuredOutputsParams(json=builtin["structured_outputs"])
    if "logit_bias" in builtin:
        builtin["logit_bias"] = {int(k): v for k, v in builtin["logit_bias"].items()}
    builtin.setdefault("max_tokens", 4)
    return SamplingParams(extra_args=case.xargs, **builtin)


@pytest.mark.engine
def test_offline_api_raises_value_error_naming_each_field(llm):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    wrong = []
    for case in CORPUS:
        try:
            llm.generate(["Hello"], _sampling_params(case), use_tqdm=False)
            wrong.append(f"{case.id}: accepted")
        except VLLMValidationError as exc:  # vLLM 0.32 re-raises a processor's ValueError
            cause = exc.__cause__
            if not isinstance(cause, ValueError) or f"'{case.field}'" not in str(cause):
                wrong.append(f"{case.id}: {cause!r}"[:300])
    assert wrong == []
    good = SamplingParams(max_tokens=6, temperature=1.0, extra_args=GOOD_XARGS)
    out = llm.generate(["Hi"], good, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.text) == 3


@pytest.mark.parametrize(
    ("pattern", "size"),
    [
        (r"[a-z]{2,8}-\d{4}", 13),
        ("(ab|c)*d", 4),
        ("x{1000000}", 1_000_000),
        ("(a{100}){100}", 10_000),
        ("(a|aa){1000}{1000}", 1_000_000),  # stacked counts: Python's re cannot parse it
    ],
)
def test_regex_size_unrolls_counted_repetitions(pattern, size):
    assert regex_size(pattern) == size


def test_regex_size_limit_is_inclusive():
    assert regex_size_problem("x{20000}", limit=20_000) is None
    assert "20,001" in regex_size_problem("x{20001}", limit=20_000)


def test_stream_check_matches_the_engine_check_without_a_server():
    from constrained.stream_checks import check_xargs

    assert "'min_p'" in check_xargs({"min_p": 2.0})
    assert "'regex'" in check_xargs({"regex": "(unclosed", "json_schema": "{}"})
    assert check_xargs({"min_p": 0.2, "repetition_penalty": 1.1}) is None
    assert check_xargs(["not", "a", "mapping"]) is None  # vLLM's request model refuses it


def test_stats_snapshot_counts_slots_objects_and_compile_cache(tmp_path, monkeypatch):
    import numpy as np

    from constrained.grammars.stack import COMPILE_WAITS
    from constrained.processors.stats import StatsReporter

    class Slots:
        def __init__(self) -> None:
            self.capacity = 4
            self.active = np.array([True, False, True, False])
            self.payload = [object(), None, None, None]

    class Vocab:
        from_record = True  # built from the tokenizer's record, not a second load

    class Compiler:
        cache_size = 512
        compiled = 1
        loaded = 6
        vocab = Vocab()

        def cache_len(self) -> int:
            return 7

    class FakeProcessor:
        slots = Slots()
        compiler = Compiler()

    reporter = StatsReporter(str(tmp_path / "stats.json"), interval_s=0)
    proc = FakeProcessor()
    reporter.register(proc)
    reporter.tick()
    snap = json.loads((tmp_path / "stats.json").read_text())
    assert snap["processors"]["FakeProcessor"] == {"active_slots": 2, "payloads": 1, "capacity": 4}
    assert snap["compile_cache"] == {"entries": 7, "capacity": 512, "compiled": 1, "loaded": 6}
    assert snap["vocab_from_record"] is True
    monkeypatch.setattr(COMPILE_WAITS, "count", 2)  # two rows waited for their compile
    monkeypatch.setattr(COMPILE_WAITS, "seconds", 0.06123)
    monkeypatch.setattr(COMPILE_WAITS, "started", 3)  # three took admission's first row
    assert reporter.snapshot()["compile_waits"] == {"count": 2, "seconds": 0.0612, "started": 3}
    assert StatsReporter(None, 0).snapshot()["vocab_from_record"] is False
    assert StatsReporter(None, 0).snapshot()["processors"] == {}  # disabled: registers nothing
