"""What tests/test_clients.py asks every client library for, shared with the clients that run
in a virtual environment of their own (tests/instructor_client.py): only pydantic here."""

from __future__ import annotations

import enum

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
