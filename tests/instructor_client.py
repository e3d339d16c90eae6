"""instructor's flow, run by tests/test_clients.py in instructor's own virtual environment
(tests/instructor-requirements.txt; see tests/client_venv.py): one ``instructor.from_openai``
request to the session's server, then ``RESULT`` and a JSON line on stdout: the validated
object and the versions that made it.

    python -m tests.instructor_client BASE_URL MODE SEED   (from the repository root)
"""

from __future__ import annotations

import argparse
import json

import instructor
import openai
import pydantic

from tests.client_models import NO_THINKING, PROMPT, Pet


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("mode", help="an instructor.Mode name: TOOLS, JSON_SCHEMA, ...")
    parser.add_argument("seed", type=int)
    args = parser.parse_args()
    client = instructor.from_openai(
        openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0),
        mode=instructor.Mode[args.mode],
    )  # fmt: skip
    pet = client.chat.completions.create(
        model="tiny", response_model=Pet, messages=[{"role": "user", "content": PROMPT}],
        max_retries=1, temperature=1.0, seed=args.seed, max_tokens=200, extra_body=NO_THINKING,
    )  # fmt: skip
    assert isinstance(pet, Pet), repr(pet)
    versions = {"instructor": instructor.__version__, "openai": openai.__version__,
                "pydantic": pydantic.VERSION}  # fmt: skip
    print("RESULT " + json.dumps({"pet": pet.model_dump(mode="json"), "versions": versions}))


if __name__ == "__main__":
    main()
