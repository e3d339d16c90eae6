"""The client libraries users have, against the stock server with our plugin (#29): each flow
one request (temperature 1, a seed) to the tiny qwen3.6 model, whose text is noise, and a
validated pydantic object back. What each flow does and why some cannot work: docs/clients.md.

Versions tested: the ``test`` extra in pyproject.toml (a library of the extra that is not
installed skips its tests), and tests/instructor-requirements.txt for instructor, which
cannot be installed beside vLLM: it runs in a virtual environment of its own
(tests/client_venv.py), made by the session (never skipped), as a subprocess speaking HTTP
to the same server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.client_models import NO_THINKING, PROMPT, Pet
from tests.client_venv import client_env, client_venv, pins

ROOT = Path(__file__).resolve().parent.parent
INSTRUCTOR_REQUIREMENTS = Path(__file__).with_name("instructor-requirements.txt")


@pytest.fixture(scope="module", params=["parsers", "plain"])
def base_url(request) -> str:
    """The ``response_format`` flows against two servers of the session: ``parsers``, vLLM's
    stock server on the tiny qwen3.6 model with its reasoning and tool-call parsers
    (``stock36``), and ``plain``, the tiny Qwen2 model with neither (``server``: our
    launcher)."""
    name = "stock36" if request.param == "parsers" else "server"
    return request.getfixturevalue(name) + "/v1"


@pytest.fixture(scope="module")
def tools_url(stock36) -> str:
    """The tool-call flows: only where a tool-call parser is set (vLLM answers a named or
    required ``tool_choice`` without one with HTTP 400, "requires --tool-call-parser")."""
    return stock36 + "/v1"


def valid(value: object) -> Pet:
    assert isinstance(value, Pet), repr(value)
    return Pet.model_validate(value.model_dump())


# --- LangChain ----------------------------------------------------------------------------


def test_langchain_json_schema(base_url):
    _langchain_with_structured_output(base_url, "json_schema", 1)


def test_langchain_function_calling(tools_url):
    _langchain_with_structured_output(tools_url, "function_calling", 2)


def _langchain_with_structured_output(base_url: str, method: str, seed: int) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        model="tiny", base_url=base_url, api_key="unused", temperature=1.0, seed=seed,
        max_tokens=200, max_retries=0, extra_body=NO_THINKING,
    )  # fmt: skip
    valid(chat.with_structured_output(Pet, method=method).invoke(PROMPT))


# --- pydantic-ai --------------------------------------------------------------------------


def _pydantic_ai_agent(base_url: str, output_type: object, seed: int):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    settings = {"temperature": 1.0, "seed": seed, "max_tokens": 200, "extra_body": NO_THINKING}
    return Agent(model, output_type=output_type, model_settings=settings, retries=0)


def test_pydantic_ai_tool_output(tools_url):
    """The default: the model calls an output tool (``final_result``) whose parameters are
    the model's schema, ``$ref`` and all; ``tool_choice`` required."""
    agent = _pydantic_ai_agent(tools_url, Pet, seed=3)
    valid(agent.run_sync(PROMPT).output)


def test_pydantic_ai_native_output(base_url):
    """``NativeOutput``: ``response_format`` with the model's JSON schema."""
    from pydantic_ai import NativeOutput

    agent = _pydantic_ai_agent(base_url, NativeOutput(Pet), seed=4)
    valid(agent.run_sync(PROMPT).output)


# --- openai-agents ------------------------------------------------------------------------


def test_openai_agents_output_type(base_url):
    """``Agent(output_type=Pet)`` on the Chat Completions model: ``response_format`` with the
    strict JSON schema."""
    pytest.importorskip("agents")
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace export (there is no network)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    agent = Agent(
        name="pets", instructions="Answer with a pet.", output_type=Pet,
        model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(temperature=1.0, max_tokens=200,
                                     extra_body={"seed": 5, **NO_THINKING}),
    )  # fmt: skip
    valid(Runner.run_sync(agent, PROMPT).final_output)


# --- instructor (its own venv: tests/instructor-requirements.txt) ------------------------


@pytest.fixture(scope="module")
def instructor_python(request, tmp_path_factory) -> Path:
    """The python of instructor's venv, in pytest's cache (made on the first run, about
    15-40 s; reused while the pins are the same). Never skipped: a venv that cannot be made
    is an error."""
    cache = getattr(request.config, "cache", None)
    root = cache.mkdir("instructor-venv") if cache else tmp_path_factory.mktemp("instructor")
    return client_venv(Path(root), INSTRUCTOR_REQUIREMENTS)


# JSON and MD_JSON are not here: instructor sends no schema to enforce (docs/clients.md).
@pytest.mark.parametrize(("mode", "seed"), [("TOOLS", 6), ("TOOLS_STRICT", 7)])
def test_instructor_tools(tools_url, instructor_python, mode, seed):
    _instructor_from_openai(tools_url, instructor_python, mode, seed)


def test_instructor_json_schema(base_url, instructor_python):
    _instructor_from_openai(base_url, instructor_python, "JSON_SCHEMA", 8)


def _instructor_from_openai(base_url: str, instructor_python: Path, mode: str, seed: int) -> None:
    out = subprocess.run(
        [str(instructor_python), "-m", "tests.instructor_client", base_url, mode, str(seed)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=client_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    pinned = pins(INSTRUCTOR_REQUIREMENTS)
    assert result["versions"] == {name: pinned[name] for name in result["versions"]}
    Pet.model_validate(result["pet"])
