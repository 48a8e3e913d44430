"""The HTTP doors the SSE-streaming bench modes speak: what each one's request body is and how its
server-sent events are read (firsttoken/bench/direct.py's `DirectClient` does the HTTP).

- `CHAT` (`direct`, `litellm`, `openai`): `POST /chat/completions`, `chat.completion.chunk`
  events; a token is a non-empty content delta.
- `RESPONSES` (`responses`): firsttoken's `POST /v1/responses` (gateway/responses.py), typed
  events (gateway/responses_protocol.py); a token is a `response.output_text.delta` event, the
  end `response.completed` (or `.incomplete`), a failure `error` then `response.failed`.

Reading is pure, over bytes: `read(events, result)` takes the complete events of one network
chunk (separated by blank lines), returns how many text deltas they hold, and records the rare
final event's usage and stage timings, or an error, on `result`. Deltas are counted as bytes, not
parsed: the load generator has to stay far cheaper than the thing it measures, and JSON-encoded
text cannot hold the markers (its quotes are escaped). Only the rare final events are parsed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from firsttoken.bench.loadgen import _loads
from firsttoken.bench.stats import RequestResult

Body = Callable[[str, str, int | None], dict[str, Any]]
Reader = Callable[[bytes, RequestResult], int]


@dataclass(frozen=True, slots=True)
class Door:
    """One streaming HTTP API: its path under the base URL, its request body for
    (model, prompt, max_tokens), and its event reader."""

    name: str
    path: str
    body: Body
    read: Reader


def _data(event: bytes) -> dict[str, Any]:
    """An event's JSON data (its `data: ` line), or {} where it has none or it does not parse."""
    at = event.find(b"data: {")
    if at < 0:
        return {}
    try:
        data = _loads(event[at + 6 :])
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _extras(result: RequestResult, extras: Any) -> None:
    """firsttoken's own answer fields (`x_firsttoken`, gateway/openai_protocol.py `extras`)."""
    if isinstance(extras, dict):
        result.server_timings = extras.get("timings") or {}
        result.cached = bool(extras.get("cached"))


# --- Chat Completions -----------------------------------------------------------------------

# Compact JSON (vLLM, the simulator) and json.dumps' default spacing (LiteLLM).
_CONTENT = (b'"content":"', b'"content": "')
_EMPTY = (b'"content":""', b'"content": ""')
_USAGE = b'"usage":{'
# firsttoken's OpenAI door: the last chunk's stage timings (gateway/openai_protocol.py extras).
_EXTRAS = b'"x_firsttoken":{'
# A failure after the stream began: an event whose data is the error object (both spacings).
_ERROR = b'data: {"error":'


def chat_body(model: str, prompt: str, max_tokens: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
        "stream_options": {"include_usage": True},
    }
    if max_tokens:
        body["max_tokens"] = max_tokens
    return body


def read_chat(events: bytes, result: RequestResult) -> int:
    # An empty content delta (the role chunk) is `"content":""`; every other one is a token.
    n = sum(events.count(c) for c in _CONTENT) - sum(events.count(e) for e in _EMPTY)
    if _USAGE in events or _EXTRAS in events or _ERROR in events:
        for event in events.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                continue
            if _USAGE in event or _EXTRAS in event:
                data = _data(event)
                if _USAGE in event:
                    usage = data.get("usage") or {}
                    result.tokens = int(usage.get("completion_tokens", 0))
                if _EXTRAS in event:
                    _extras(result, data.get("x_firsttoken"))
            elif event.startswith(_ERROR) and result.error is None:
                error = _data(event).get("error")
                code = error.get("code") if isinstance(error, dict) else None
                result.error = str(code or "stream_error")
    return n


CHAT = Door("chat", "/chat/completions", chat_body, read_chat)


# --- Responses ------------------------------------------------------------------------------

_DELTA = b"event: response.output_text.delta\n"
_EMPTY_DELTA = b'"delta":""'
_FINAL = (b"event: response.completed\n", b"event: response.incomplete\n")
_FAILED = (b"event: error\n", b"event: response.failed\n")


def responses_body(model: str, prompt: str, max_tokens: int | None) -> dict[str, Any]:
    # `store: false`: one turn on the path the Chat Completions door takes. A stored response
    # (the API's default) also starts a server-kept conversation, skips the answer cache and
    # writes a Redis record: other work, not the door's.
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "store": False,
        "input": [{"role": "user", "content": prompt}],
    }
    if max_tokens:
        body["max_output_tokens"] = max_tokens
    return body


def read_responses(events: bytes, result: RequestResult) -> int:
    deltas = events.count(_DELTA)
    n = deltas - events.count(_EMPTY_DELTA)
    if events.count(b"event: ") == deltas:  # deltas only: the common case
        return n
    for event in events.split(b"\n\n"):
        if event.startswith(_FINAL):
            response = _data(event).get("response") or {}
            usage = response.get("usage") or {}
            result.tokens = int(usage.get("output_tokens", 0))
            _extras(result, response.get("x_firsttoken"))
        elif event.startswith(_FAILED) and result.error is None:
            data = _data(event)
            if event.startswith(b"event: error\n"):
                result.error = str(data.get("code") or "stream_error")
            else:
                error = (data.get("response") or {}).get("error") or {}
                result.error = str(error.get("code") or "response_failed")
    return n


RESPONSES = Door("responses", "/responses", responses_body, read_responses)
