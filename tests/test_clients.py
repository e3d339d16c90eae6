"""The client libraries users have, against the stock server with our plugin (#29): each flow
one request (temperature 1, a seed) to the tiny qwen3.6 model, whose text is noise, and a
validated pydantic object back. What each flow does and why some cannot work: docs/clients.md.

Versions tested: the ``test`` extra in pyproject.toml. A library that is not installed skips
its tests."""

from __future__ import annotations

import enum

import pytest
from pydantic import BaseModel, ConfigDict, Field

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPT = "Describe a pet."


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Pet(BaseModel):
    """A pet: an ``Enum`` field makes pydantic write a ``$ref`` into ``$defs``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    color: Color


@pytest.fixture(scope="module")
def base_url(stock36) -> str:
    return stock36 + "/v1"


def valid(value: object) -> Pet:
    assert isinstance(value, Pet), repr(value)
    return Pet.model_validate(value.model_dump())


# --- LangChain ----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "seed"), [("json_schema", 1), ("function_calling", 2)])
def test_langchain_with_structured_output(base_url, method, seed):
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


def test_pydantic_ai_tool_output(base_url):
    """The default: the model calls an output tool (``final_result``) whose parameters are
    the model's schema, ``$ref`` and all; ``tool_choice`` required."""
    agent = _pydantic_ai_agent(base_url, Pet, seed=3)
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


# --- instructor (not in the test extra: see docs/clients.md; skipped when absent) ---------


@pytest.mark.parametrize(("mode", "seed"), [("TOOLS", 6), ("TOOLS_STRICT", 7), ("JSON_SCHEMA", 8)])
def test_instructor_from_openai(base_url, mode, seed):
    instructor = pytest.importorskip("instructor")
    import openai

    client = instructor.from_openai(
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0),
        mode=getattr(instructor.Mode, mode),
    )  # fmt: skip
    pet = client.chat.completions.create(
        model="tiny", response_model=Pet, messages=[{"role": "user", "content": PROMPT}],
        max_retries=1, temperature=1.0, seed=seed, max_tokens=200, extra_body=NO_THINKING,
    )  # fmt: skip
    valid(pet)
