"""The engine over any OpenAI-compatible server (``vllm serve``, the sim server, others).

One pooled HTTP client per engine, and one engine per process: a chat worker holds many
streams at once, and a fresh connection per request would add a TCP handshake to every
time-to-first-token.

Stopping early always closes the HTTP response, which closes its connection (a half-read
response cannot go back to the pool); vLLM sees the disconnect and aborts the request, so
the GPU stops spending on it. The consumer stops a stream by ``aclose()``, by cancelling the
task that iterates it, or by ``abort(request_id)`` from any task: that closes the response
under the reader, whose stream then ends with a last ``Delta(finish_reason="abort")``
(nothing is raised).

Failures are ``EngineError`` with the server's URL and the reason (unreachable, HTTP status
and message, stream broken off, malformed chunk). Connection errors and HTTP 502/503/504 are
retried ``FIRSTTOKEN_ENGINE_RETRIES`` times, only before the first token. Deadlines on the
first token and between tokens are applied around every engine by
``shared.engines.deadlines``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI

from shared.engines.aiohttp_transport import AiohttpTransport
from shared.engines.base import Delta, EngineRequest, EngineStats
from shared.errors import ConfigError, EngineError
from shared.settings import Settings

# A refused connection is answered in microseconds; a restarting server needs a moment. The
# first-token deadline bounds the total either way.
RETRY_BACKOFF_S = 0.05
# Statuses that mean "this server cannot take it right now", not "this request is wrong".
RETRYABLE_STATUS = frozenset({502, 503, 504})

# Far above any one worker's concurrency: the pool must never be what queues a request.
MAX_CONNECTIONS = 1000


class OpenAIEngine:
    """The Engine protocol over ``openai.AsyncOpenAI``; counters in ``stats``."""

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
        self.retries = settings.engine_retries
        self.stats = EngineStats()
        # No read timeout: a long answer may stream for minutes; the generation stage's
        # first-token and idle deadlines (shared/engines/deadlines.py) decide when silence is
        # too long. Connecting must fail fast, though.
        self._http = httpx.AsyncClient(
            transport=AiohttpTransport(max_connections=MAX_CONNECTIONS),
            timeout=httpx.Timeout(None, connect=settings.engine_connect_timeout_s),
        )
        # Retries are this class's own (below), so the SDK's are off: the SDK would also
        # retry after tokens had been yielded, and with its own long backoff.
        self._client = AsyncOpenAI(
            base_url=url,
            api_key=api_key or settings.engine_api_key,
            max_retries=0,
            # openai>=3 speaks httpx2 natively but still accepts an httpx client; httpx is
            # what this project depends on, and works with every openai version we allow.
            http_client=self._http,  # type: ignore[arg-type]
        )
        self._streams: dict[str, httpx.Response] = {}  # request id -> its streaming response
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
                except EngineError as exc:
                    if yielded or attempt == self.retries or not _retryable(exc.__cause__):
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
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.temperature is not None:  # unset, the server applies the model's default
            body["temperature"] = request.temperature
        # The SDK sends the request (auth, headers, an APIStatusError for an HTTP error) and
        # hands back the raw response; the stream's lines are parsed here. Going through
        # `chat.completions.create` measured ~9% of a chat worker's CPU in its parameter
        # transform alone, and building the SDK's pydantic chunk object per token ~28%, for
        # a plain dict and three fields read.
        try:
            response = await self._client.post(
                "/chat/completions", cast_to=httpx.Response, body=body, stream=True
            )
        except openai.APIError as exc:
            raise self._wrap(exc) from exc
        self._streams[request_id] = response
        self.stats.running += 1
        try:
            async with aclosing(self._deltas(response, request_id)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            self.stats.running -= 1
            del self._streams[request_id]
            # Closing a half-read response drops its connection: the server's disconnect.
            await response.aclose()

    async def _deltas(
        self, response: httpx.Response, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        finish_reason: str | None = None
        prompt_tokens = completion_tokens = None
        try:
            async for data in sse_data(response.aiter_bytes()):
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error") is not None:
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise EngineError(f"engine at {self.url} failed mid-stream: {message}")
                usage = chunk.get("usage")
                if usage:
                    prompt_tokens = usage.get("prompt_tokens")
                    completion_tokens = usage.get("completion_tokens")
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
            if isinstance(exc, openai.APIStatusError):
                raise self._wrap(exc) from exc
            if isinstance(exc, openai.APIError | httpx.HTTPError):
                # Once streaming, a connection error means the server went away mid-answer.
                raise EngineError(
                    f"engine at {self.url} broke off the stream: {_cause(exc)}"
                ) from exc
            if isinstance(exc, ValueError | TypeError | AttributeError | KeyError):
                raise EngineError(f"engine at {self.url} sent a malformed chunk: {exc}") from exc
            raise
        if request_id in self._aborted:
            yield Delta(finish_reason="abort")
            return
        if finish_reason is None:
            raise EngineError(f"engine at {self.url} ended the stream without a finish reason")
        # The usage chunk comes after the finish reason, so the final delta waits for it.
        yield Delta(
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    async def abort(self, request_id: str) -> None:
        """Close that request's HTTP response; its stream ends with finish_reason "abort"."""
        if request_id not in self._active:
            return
        # Marked even between attempts, so a retry does not start an aborted request again.
        self._aborted.add(request_id)
        response = self._streams.get(request_id)
        if response is not None:
            await response.aclose()

    async def aclose(self) -> None:
        for request_id in list(self._active):
            await self.abort(request_id)
        await self._client.close()
        await self._http.aclose()

    def _wrap(self, exc: Exception) -> EngineError:
        if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException):
            return EngineError(f"engine at {self.url} timed out: {_cause(exc)}")
        if isinstance(exc, openai.APIConnectionError | httpx.TransportError):
            return EngineError(f"engine at {self.url} unreachable: {_cause(exc)}")
        if isinstance(exc, openai.APIStatusError):
            return EngineError(
                f"engine at {self.url} returned HTTP {exc.status_code}: {_detail(exc)}"
            )
        return EngineError(f"engine at {self.url} failed: {exc}")


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The `data:` payloads of a server-sent event stream, from its raw bytes.

    Lines are split here rather than by httpx's `aiter_lines` (three more generator layers
    and a text decode per network read, on every token of every stream). An event with
    several `data:` lines is not joined: OpenAI-compatible servers send one line per chunk.
    """
    pending = b""
    async for chunk in chunks:
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()  # an incomplete last line waits for the next read
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()


def _retryable(exc: BaseException | None) -> bool:
    """Errors worth one more try before the first token: the request never reached a model."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS
    # A timeout is not retried: the first-token deadline has (nearly) been spent on it.
    if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException):
        return False
    return isinstance(exc, openai.APIConnectionError | httpx.TransportError)


def _detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return exc.message


def _cause(exc: Exception) -> str:
    # openai's connection errors say only "Connection error."; the httpx cause says why.
    cause = exc.__cause__
    return f"{exc} ({cause!r})" if cause is not None else str(exc)
