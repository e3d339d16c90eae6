"""Server middleware: a streaming request with bad ``vllm_xargs`` gets HTTP 400, not a stream.

vLLM validates logits-processor options when the request reaches the engine client, which for
``"stream": true`` is after the HTTP 200 and the first bytes of the event stream: the error
arrives as a ``data: {"error": {..., "code": 400}}`` event. Our launcher registers this
middleware (vLLM's ``--middleware``) so such requests are checked first, the same way the
engine will check them (options parsed, constraint compiled with the served tokenizer, in a
worker thread, not on the event loop) and refused with a 400 naming the field. Requests that
pass go on unchanged; the compile is cached, so the engine's own check costs nothing more.
Conflicts with vLLM's own fields (``min_p`` set twice...) are still refused by the engine's
check, inside the stream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from constrained.admission import check_xargs

CHECKED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


async def refuse_bad_streaming_options(request: Request, call_next: Any) -> Response:
    if request.method == "POST" and request.url.path in CHECKED_PATHS:
        body = await request.body()  # Starlette keeps it for the handler
        try:
            data = json.loads(body)
        except ValueError:
            data = None  # vLLM answers malformed JSON itself
        if isinstance(data, dict) and data.get("stream") and data.get("vllm_xargs"):
            config = getattr(request.app.state, "vllm_config", None)
            message = await asyncio.to_thread(check_xargs, data["vllm_xargs"], config)
            if message is not None:
                error = {"message": message, "type": "BadRequestError", "param": None,
                         "code": 400}  # fmt: skip
                return JSONResponse({"error": error}, status_code=400)
    return await call_next(request)
