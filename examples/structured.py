"""Structured output: a pydantic model, a regex and a grammar, each per request.

Run: python examples/structured.py [MODEL_DIR]   (default: the embedded tiny model)
"""

import os
import sys
from typing import Annotated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from pydantic import BaseModel, ConfigDict, Field
from vllm import LLM, SamplingParams

import constrained
from constrained import Options
from constrained.tiny_model import build_tiny_model


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # JSON Schema allows extra keys otherwise

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    languages: list[Annotated[str, Field(max_length=12)]] = Field(max_length=3)


if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else str(build_tiny_model())
    llm = LLM(model=model, logits_processors=constrained.LOGITS_PROCESSORS, dtype="float32",
              enforce_eager=True, generation_config="vllm", max_model_len=1024)  # fmt: skip
    requests = {
        "pydantic": Options(json_schema=Person),
        "flexible JSON": Options(json_schema=Person, whitespace="flexible", max_whitespace=1),
        "regex": Options(regex=r"[A-Z]{2}-[0-9]{4}"),
        "grammar": Options(
            grammar='root ::= ("yes" | "no") ", it is " ("cheap" | "fast" | "safe") "."'
        ),
    }
    for label, options in requests.items():
        params = SamplingParams(temperature=1.0, seed=1, max_tokens=200,
                                extra_args=options.to_extra_args())  # fmt: skip
        out = llm.generate(["Answer:"], params, use_tqdm=False)[0].outputs[0]
        print(f"{label:>13} [{out.finish_reason}]: {out.text!r}")
        if label == "pydantic" and out.finish_reason == "stop":
            print(f"{'':>13}  -> {Person.model_validate_json(out.text)!r}")
