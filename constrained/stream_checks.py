"""Server middleware: ``vllm_xargs`` checked and compiled off the event loop, before vLLM.

Two jobs, for every completions / chat request that carries ``vllm_xargs``:

- **Streaming requests with bad options get HTTP 400, not a stream.** vLLM validates
  logits-processor options when the request reaches the engine client, which for
  ``"stream": true`` is after the HTTP 200 and the first bytes of the event stream: the error
  would arrive as a ``data: {"error": {..., "code": 400}}`` event. Checked here first, the same
  way the engine's admission checks them, such requests are refused with a 400 naming the field.
- **A slow compile never blocks the event loop.** vLLM runs admission (``validate_params``)
  on the server's event loop for rendered prompts, so a constraint that takes seconds to
  compile would hold every other request's admission and streamed tokens for that long. Here
  it compiles in a worker thread; vLLM's admission then finds it in the cache.

Before both, OpenAI's ``response_format`` and vLLM's ``structured_outputs`` are moved into
``vllm_xargs`` (``openai_routing``), so they reach our processors and these checks; a
request with tools whose parameters we could not enforce is refused (HTTP 400 naming
``tools``), streaming or not: vLLM builds their constraint only after this point.

Requests that pass go on unchanged. Conflicts with vLLM's own fields (``min_p`` set
twice...) are still refused by vLLM's admission (inside the stream, for streaming requests).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from constrained.admission import check_xargs
from constrained.frontend import loaded_tokenizer
from constrained.openai_routing import check_tools, route
from constrained.options import OptionError
from constrained.settings import settings

CHECKED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def frontend_tokenizer(state: Any) -> Any:
    """The tokenizer vLLM's API process already loaded, or None."""
    input_processor = getattr(getattr(state, "engine_client", None), "input_processor", None)
    return loaded_tokenizer(input_processor) if input_processor is not None else None


def tool_strict_level(state: Any) -> str:
    """The server's ``--tool-strict-level`` (``auto``, ``function`` or ``parameter``)."""
    level = getattr(getattr(state, "args", None), "tool_strict_level", None) or "auto"
    return str(getattr(level, "name", level)).lower()


def request_budget(data: dict[str, Any]) -> SimpleNamespace | None:
    """The request's ``max_tokens`` and ``ignore_eos``; ``None`` when it gives no max_tokens
    (vLLM then sets the model's remaining context, which this check cannot see)."""
    max_tokens = data.get("max_completion_tokens") or data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return None
    return SimpleNamespace(max_tokens=max_tokens, ignore_eos=data.get("ignore_eos") is True)


def _bad_request(message: str) -> JSONResponse:
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return JSONResponse({"error": error}, status_code=400)


def _replace_body(request: Request, data: dict[str, Any]) -> None:
    """The handler reads this body instead (Starlette hands the cached one downstream)."""
    body = json.dumps(data).encode()
    request._body = body
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-length"]
    request.scope["headers"] = [*headers, (b"content-length", str(len(body)).encode())]


async def check_xargs_off_the_loop(request: Request, call_next: Any) -> Response:
    if request.method == "POST" and request.url.path in CHECKED_PATHS:
        body = await request.body()  # Starlette keeps it for the handler
        try:
            data = json.loads(body)
        except ValueError:
            data = None  # vLLM answers malformed JSON itself
        if isinstance(data, dict) and settings().route_structured_outputs:
            try:
                state = request.app.state
                parser = getattr(getattr(state, "args", None), "tool_call_parser", None)
                check_tools(data, tool_strict_level(state), parser)
                routed = route(data)
            except OptionError as exc:
                return _bad_request(str(exc))
            if routed is not None:
                data = routed
                _replace_body(request, data)
        if isinstance(data, dict) and data.get("vllm_xargs"):
            state = request.app.state
            config = getattr(state, "vllm_config", None)
            tokenizer = frontend_tokenizer(state)
            budget = request_budget(data)
            message = await asyncio.to_thread(
                check_xargs, data["vllm_xargs"], config, tokenizer, budget
            )
            if message is not None and data.get("stream"):
                return _bad_request(message)
    return await call_next(request)
