"""What every HTTP route of the gateway does the same way (the OpenAI doors, gateway/openai.py and
gateway/responses.py, and gateway/app.py's other `/v1` routes): read a body within a limit, and
answer an error in OpenAI's shape."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.openai_protocol import ErrorReply
from shared.errors import InvalidRequest

# A body over the limit is still read to its end (so the client gets its 400 rather than a
# reset connection) but not kept, up to this much; past it the connection is dropped.
DRAIN_LIMIT_BYTES = 64 << 20


def error_response(reply: ErrorReply, headers: dict[str, str] | None = None) -> Response:
    """An error in OpenAI's shape (every `/v1` HTTP route's, gateway/app.py's too)."""
    headers = dict(headers or {})
    if reply.retry_after_s is not None:
        headers["retry-after"] = str(reply.retry_after_s)
    return Response(
        orjson.dumps(reply.body),
        status_code=reply.status,
        headers=headers,
        media_type="application/json",
    )


async def read_body(request: Request, limit: int) -> tuple[bytes, int]:
    """The body and its size; a body over `limit` is read to its end but not kept."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > DRAIN_LIMIT_BYTES:
            raise InvalidRequest(f"the request body is over {limit} bytes, the limit")
        if size <= limit:
            parts.append(chunk)
    return b"".join(parts), size
