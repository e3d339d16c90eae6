"""Query a server started with `python -m constrained serve --model DIR --port 8000`.

Run: python examples/server_client.py [BASE_URL] [MODEL_NAME]
"""

import sys

from openai import OpenAI

from constrained import Options

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://localhost:8000/v1"
client = OpenAI(base_url=base_url, api_key="unused")
model = sys.argv[2] if len(sys.argv) > 2 else client.models.list().data[0].id

xargs = Options(frequency_penalty=0.5, min_p=0.1, logit_bias={11: 3.0}).to_vllm_xargs()
out = client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=32, extra_body={"vllm_xargs": xargs}
)
print(out.choices[0].text)

try:  # a bad option is refused with HTTP 400 naming the field
    client.completions.create(
        model=model, prompt="Hi", max_tokens=4, extra_body={"vllm_xargs": {"min_p": 3}}
    )
except Exception as exc:  # openai.BadRequestError
    print(type(exc).__name__, exc)
