"""An OpenAI-compatible HTTP server around SimEngine (`firsttoken sim-server`).

It speaks the subset of the API that vLLM's server does for chat, byte for byte where it
matters (SSE framing, the role chunk first, ``data: [DONE]``), so the ``openai`` engine path
is exercised exactly as against vLLM. One difference on purpose: the streamed usage chunk is
always sent, even without ``stream_options.include_usage``, so every stream reports tokens.

A client that disconnects mid-stream aborts its request: uvicorn reports the disconnect, and
:func:`_stream_response` cancels the sending task and closes the body iterator, so the engine
counts the abort at once rather than when the generator is garbage-collected. A streamed
answer is sent without Starlette's response class and middleware (the simulator's CPU is the
benchmark's, and it shares the machine with the stack it measures).

Fault modes (``--status``, ``--fail-rate``, ``--stall-after``, ``--malformed-after``,
``--drop-after``; see :class:`Faults`) make it misbehave the ways a real model server does, for
the engine fault tests.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from shared import tracing
from shared.errors import ConfigError
from shared.heap import freeze_startup_objects
from shared.protocol import Message
from shared.tracing.context import from_headers
from workers.engines.base import Delta, EngineRequest
from workers.engines.sim import SimEngine, SimOptions

# OpenAI's "developer" role is the newer name of "system".
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True, slots=True)
class Faults:
    """Misbehaviour on purpose, for fault tests (all off by default).

    - ``status``: answer a ``fail_rate`` share of chat requests with this HTTP status;
    - ``stall_after``: after this many content chunks, send nothing more but keep the
      connection open (0: not even the first token);
    - ``malformed_after``: after this many content chunks, send a chunk that is not JSON;
    - ``drop_after``: after this many content chunks, cut the connection mid-response.
    """

    status: int | None = None
    fail_rate: float = 1.0
    stall_after: int | None = None
    malformed_after: int | None = None
    drop_after: int | None = None

    def __post_init__(self) -> None:
        if self.status is not None and not 400 <= self.status <= 599:
            raise ValueError("--status must be an HTTP error status (400-599)")
        if not 0 <= self.fail_rate <= 1:
            raise ValueError("--fail-rate must be between 0 and 1")
        for value in (self.stall_after, self.malformed_after, self.drop_after):
            if value is not None and value < 0:
                raise ValueError("--stall-after, --malformed-after, --drop-after must be >= 0")

    def fails(self) -> bool:
        return self.status is not None and random.random() < self.fail_rate


class _Dropped(Exception):
    """Raised inside the response body to cut the connection (uvicorn closes it)."""


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def error_response(message: str, status: int) -> JSONResponse:
    """An OpenAI-style error body, as vLLM's create_error_response writes it."""
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


def _parse_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    # Content parts: only text parts mean something to a text model.
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _BadRequest(f"messages[{index}].content must be a string or a list of text parts")


def parse_chat_request(body: Any, served_model: str, default_max_tokens: int) -> EngineRequest:
    """Validate a chat completion body into an EngineRequest, or raise _BadRequest."""
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    model = body.get("model", served_model)
    if model != served_model:
        raise _BadRequest(f"The model `{model}` does not exist.", status=404)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _BadRequest("'messages' is required and must be a non-empty list")
    messages = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or item.get("role") not in _ROLES:
            raise _BadRequest(f"messages[{i}] needs a role of {', '.join(_ROLES)}")
        try:
            messages.append(
                Message(role=_ROLES[item["role"]], content=_parse_content(item.get("content"), i))  # type: ignore[arg-type]
            )
        except ValidationError as exc:
            raise _BadRequest(f"messages[{i}] is invalid: {exc.errors()[0]['msg']}") from exc
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _BadRequest("max_tokens must be a positive integer")
    temperature = body.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or not 0 <= temperature <= 2
    ):
        raise _BadRequest("temperature must be a number between 0 and 2")
    if body.get("n", 1) != 1:
        raise _BadRequest("only n=1 is supported")
    # vLLM's chat extras for continuing an answer, checked as vLLM checks them.
    continue_final = body.get("continue_final_message", False)
    if not isinstance(continue_final, bool) or not isinstance(
        body.get("add_generation_prompt", True), bool
    ):
        raise _BadRequest("continue_final_message and add_generation_prompt must be booleans")
    if continue_final and body.get("add_generation_prompt", False):
        raise _BadRequest(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    if continue_final and messages[-1].role != "assistant":
        raise _BadRequest("continue_final_message needs an assistant message last")
    return EngineRequest(
        messages=messages,
        model=model,
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        continue_final=continue_final,
    )


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    """A token's text as a JSON string (the same few hundred words recur in every answer)."""
    return json.dumps(text).encode()


def _usage(delta: Delta) -> dict[str, Any]:
    prompt, completion = delta.prompt_tokens or 0, delta.completion_tokens or 0
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if delta.cached_prompt_tokens is not None:  # with --prefix-cache-tokens, as vLLM reports
        usage["prompt_tokens_details"] = {"cached_tokens": delta.cached_prompt_tokens}
    return usage


class _Events:
    """One completion's SSE events, as vLLM frames them.

    A content token is the hot path of the whole simulator (one event per token per stream):
    its bytes are the stream's fixed prefix, the token as a JSON string and a fixed suffix,
    the same bytes ``chunk`` builds, without building and encoding a dict per token."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        head = json.dumps(self.head, separators=(",", ":")).encode()
        self._prefix = b"data: " + head[:-1] + b',"choices":[{"index":0,"delta":{"content":'
        self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def chunk(self, delta: dict[str, str], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _sse({**self.head, "choices": [choice]})

    def content(self, text: str) -> bytes:
        return self._prefix + _json_string(text) + self._suffix

    def usage(self, delta: Delta) -> bytes:
        return _sse({**self.head, "choices": [], "usage": _usage(delta)})


async def _sse_events(
    engine: SimEngine,
    request: EngineRequest,
    completion_id: str,
    faults: Faults,
) -> AsyncGenerator[bytes, None]:
    """The response body, event by event."""
    events = _Events(completion_id, request.model)
    sent = 0
    completed = False
    yield events.chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(engine.stream(request, request_id=completion_id)) as deltas:
            async for delta in deltas:
                if sent == faults.stall_after:
                    # Holds the engine request open too, as a hung model server would.
                    await asyncio.Event().wait()
                if sent == faults.malformed_after:
                    yield b'data: {"id": "' + completion_id.encode() + b'", "choices": [{\n\n'
                    return
                if sent == faults.drop_after:
                    raise _Dropped(completion_id)
                if delta.finish_reason is None:
                    sent += 1
                    yield events.content(delta.text)
                    continue
                yield events.chunk({"content": delta.text}, delta.finish_reason)
                yield events.usage(delta)
        completed = True
    finally:
        if not completed:
            # When the engine let go of an unfinished request: a disconnect-to-abort probe reads it.
            engine.stats.extra["last_abort_at"] = time.time()
    yield b"data: [DONE]\n\n"


_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def _stream_response(body: AsyncGenerator[bytes, None], receive: Receive, send: Send) -> None:
    """Send ``body`` as a chunked SSE response straight to the server's ``send``.

    Starlette's StreamingResponse and its middleware pass every ``send`` through three more
    coroutines; at one event per token per stream they took a tenth of this server's CPU at
    200 streams. Here a watcher task waits for the client to go away and then cancels the
    sending task, which closes ``body`` (and so aborts the engine request) wherever it waits."""
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    gone = False
    sending = asyncio.current_task()
    assert sending is not None

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        sending.cancel()

    watcher = asyncio.create_task(watch())
    try:
        async with aclosing(body):
            async for event in body:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not gone:
            raise  # cancelled from outside, not by the watcher
        sending.uncancel()
    finally:
        watcher.cancel()


class _StatsCollector(Collector):
    """Reads the engine's counters at scrape time: no second bookkeeping to drift."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats
        for name, value, doc in (
            ("started", stats.started, "Requests the simulator started."),
            ("finished", stats.finished, "Requests that generated their whole answer."),
            ("aborted", stats.aborted, "Requests stopped early (abort or client disconnect)."),
        ):
            yield CounterMetricFamily(f"firsttoken_sim_requests_{name}", doc, value=value)
        yield GaugeMetricFamily(
            "firsttoken_sim_requests_running", "Requests generating now.", value=stats.running
        )
        yield GaugeMetricFamily(
            "firsttoken_sim_last_abort_timestamp_seconds",
            "Wall-clock time the last unfinished request was let go (disconnect or abort).",
            value=stats.extra.get("last_abort_at", 0),
        )
        yield GaugeMetricFamily(
            "firsttoken_sim_requests_queued",
            "Requests waiting for a free sequence slot.",
            value=stats.extra.get("queued", 0),
        )


CHAT_PATH = "/v1/chat/completions"


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body, or None if the client left before sending all of it."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


class _ChatCompletions:
    """``POST /v1/chat/completions`` as a bare ASGI app (its stream: see _stream_response)."""

    def __init__(
        self, engine: SimEngine, model_name: str, default_max_tokens: int, faults: Faults
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.on:  # continue the caller's trace, as vLLM does with --otlp-traces-endpoint
            client = from_headers(_trace_headers(scope))
            with tracing.server_span(client, "llm_request", **{"gen_ai.system": "firsttoken-sim"}):
                await self._serve(scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await _read_body(receive)
        if raw is None:
            return
        response = self._refused(raw)
        if isinstance(response, Response):
            await response(scope, receive, send)
            return
        body, request = response
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            events = _sse_events(self.engine, request, completion_id, self.faults)
            await _stream_response(events, receive, send)
        else:
            answer = await _complete(self.engine, request, completion_id)
            await JSONResponse(answer)(scope, receive, send)

    def _refused(self, raw: bytes) -> Response | tuple[dict[str, Any], EngineRequest]:
        """The error response for a request that gets one, else the body and the request."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return error_response(f"request body is not valid JSON: {exc}", 400)
        try:
            request = parse_chat_request(body, self.model_name, self.default_max_tokens)
        except _BadRequest as exc:
            return error_response(exc.message, exc.status)
        if self.faults.fails():
            status = self.faults.status or 500
            return error_response(f"simulated failure (HTTP {status})", status)
        return body, request


def _trace_headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in (b"traceparent", b"tracestate")
    }


class _SimApp(Starlette):
    """Starlette, except that a chat completion skips its middleware, whose wrappers of
    ``send`` would run once per token per stream (see _stream_response). The route is declared
    too, so that other methods get Starlette's 405."""

    def __init__(self, chat: ASGIApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == CHAT_PATH:
            scope["app"] = self
            await self._chat(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    options: SimOptions,
    model_name: str = "sim",
    faults: Faults | None = None,
    *,
    freeze_heap: bool = False,
) -> Starlette:
    """The server's ASGI app; each app has its own engine and metrics registry.

    ``freeze_heap``: once the server has started, move every object alive then out of the
    garbage collector's view, as ``vllm serve`` does (``freeze_gc_heap`` in its lifespan):
    without it a full collection walks the whole start-up heap and stops this server under
    load, in the middle of a burst of first tokens."""
    engine = SimEngine(options)
    registry = CollectorRegistry()
    registry.register(_StatsCollector(engine))

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "firsttoken"}
                ],
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if freeze_heap:
            freeze_startup_objects()
        yield

    chat = _ChatCompletions(engine, model_name, options.max_tokens, faults or Faults())
    app = _SimApp(
        chat,
        routes=[
            Route(CHAT_PATH, chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    return app


async def _complete(
    engine: SimEngine, request: EngineRequest, completion_id: str
) -> dict[str, Any]:
    parts: list[str] = []
    final = Delta()
    async with aclosing(engine.stream(request, request_id=completion_id)) as deltas:
        async for delta in deltas:
            parts.append(delta.text)
            final = delta
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(parts)},
                "logprobs": None,
                "finish_reason": final.finish_reason,
            }
        ],
        "usage": _usage(final),
    }


def build_parser() -> argparse.ArgumentParser:
    from shared.settings import get_settings

    s = get_settings()
    p = argparse.ArgumentParser(
        prog="firsttoken sim-server",
        description="OpenAI-compatible chat server backed by the simulated engine.",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8100, help="port (default: %(default)s)")
    p.add_argument("--model", default="sim", help="served model name (default: %(default)s)")
    p.add_argument(
        "--ttft-ms",
        type=float,
        default=s.sim_ttft_ms,
        help="time to first token, ms (default: %(default)s)",
    )
    p.add_argument(
        "--itl-ms",
        type=float,
        default=s.sim_itl_ms,
        help="inter-token latency, ms (default: %(default)s)",
    )
    p.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=s.sim_prefill_ms_per_token,
        help="extra time to first token per prompt token, ms (default: %(default)s)",
    )
    p.add_argument(
        "--max-seqs",
        type=int,
        default=s.sim_max_seqs,
        help="sequences generated at once; more wait (default: %(default)s)",
    )
    p.add_argument(
        "--jitter",
        type=float,
        default=s.sim_jitter,
        help="relative random noise of every delay, 0..1 (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=s.sim_max_tokens,
        help="longest answer, in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--step-ms",
        type=float,
        default=s.sim_step_ms,
        help="emit every token on a shared clock ticking this often, as a batched decoder "
        "does; 0: each answer keeps its own schedule (default: %(default)s)",
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=s.sim_prefix_cache_tokens,
        help="prompt tokens the prefix cache holds; a prompt then pays --prefill-ms-per-token "
        "only past its cached prefix, and its usage reports prompt_tokens_details."
        "cached_tokens, as vLLM's; 0: no cache (default: %(default)s)",
    )
    faults = p.add_argument_group("faults", "misbehave on purpose, for fault tests")
    faults.add_argument("--status", type=int, help="answer chat requests with this HTTP status")
    faults.add_argument(
        "--fail-rate",
        type=float,
        default=1.0,
        help="share of chat requests that get --status (default: %(default)s)",
    )
    faults.add_argument(
        "--stall-after",
        type=int,
        metavar="N",
        help="after N tokens, go silent with the connection open (0: no first token)",
    )
    faults.add_argument(
        "--malformed-after", type=int, metavar="N", help="after N tokens, send a non-JSON chunk"
    )
    faults.add_argument(
        "--drop-after", type=int, metavar="N", help="after N tokens, cut the connection"
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        default=s.otlp_traces_endpoint,
        metavar="URL",
        help="export a span per request, continuing the caller's `traceparent` header, to this "
        "OTLP/HTTP traces URL, as `vllm serve --otlp-traces-endpoint` does (default: "
        "FIRSTTOKEN_OTLP_TRACES_ENDPOINT; OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT also turn it on)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    try:
        args = build_parser().parse_args(argv)
        options = SimOptions(
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            prefill_ms_per_token=args.prefill_ms_per_token,
            max_seqs=args.max_seqs,
            jitter=args.jitter,
            max_tokens=args.max_tokens,
            step_ms=args.step_ms,
            prefix_cache_tokens=args.prefix_cache_tokens,
        )
        faults = Faults(
            status=args.status,
            fail_rate=args.fail_rate,
            stall_after=args.stall_after,
            malformed_after=args.malformed_after,
            drop_after=args.drop_after,
        )
        endpoint = tracing.traces_endpoint(args.otlp_traces_endpoint, os.environ)
        if endpoint is not None:
            name = f"sim-server@{args.host}:{args.port}"
            tracing.enable(endpoint, "firsttoken-sim-server", name)
    except (ConfigError, ValueError) as exc:
        print(f"firsttoken sim-server: {exc}", file=sys.stderr)
        return 2
    print(
        f"firsttoken sim-server: model {args.model!r} on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        create_app(options, args.model, faults, freeze_heap=True),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        # Open streams must not hold a shutdown forever.
        timeout_graceful_shutdown=5,
    )
    tracing.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
