"""The ASGI app: `ws /v1/ws`, `POST /v1/chat/completions` (gateway/openai.py), `/v1/responses`
(gateway/responses.py), `GET /healthz`, `GET /readyz`, `GET /metrics`, `GET /v1/models`, and the
chat page (`GET /`, its files under `/page/`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway.auth import key_from_request
from gateway.httpio import error_response
from gateway.metrics import queue_depths
from gateway.openai import chat_completions
from gateway.openai_protocol import error_reply, exception_reply, http_error_reply
from gateway.responses import create_response, response_item
from gateway.state import Gateway
from gateway.wsdoor import Session
from shared.db.session import ping as db_ping
from shared.errors import FirstTokenError, InternalError, Overloaded, Unauthorized, error_frame
from shared.heap import freeze_startup_objects
from shared.protocol import dumps
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)

READY_CHECK_TIMEOUT_S = 2.0
# The chat page: static files shipped in the package (no build step, nothing from a CDN).
PAGE_DIR = Path(__file__).parent / "page"


async def _refuse(gw: Gateway, ws: WebSocket, exc: FirstTokenError, code: int) -> None:
    """Tell the client why (an `error` frame), then close: a bare HTTP 403 says nothing."""
    gw.metrics.errors.labels(exc.code.value).inc()
    await ws.send_text(dumps(error_frame(None, exc)))
    await ws.close(code=code, reason=exc.code.value)


async def websocket_endpoint(ws: WebSocket) -> None:
    gw: Gateway = ws.app.state.gateway
    await ws.accept()
    origin = ws.headers.get("origin")
    if not gw.guard.origin_ok(origin, ws.headers.get("host")):
        exc: FirstTokenError = Unauthorized(
            f"origin {(origin or '')[:200]!r} may not open websockets here; "
            "an operator can allow it with FIRSTTOKEN_ALLOWED_ORIGINS"
        )
        await _refuse(gw, ws, exc, 1008)
        return
    if not gw.guard.try_open():
        exc = Overloaded(
            f"this gateway process is at its limit of {gw.guard.max_connections} connections; "
            "retry later"
        )
        await _refuse(gw, ws, exc, 1013)
        return
    try:
        await _serve(gw, ws)
    finally:
        gw.guard.release()


async def _serve(gw: Gateway, ws: WebSocket) -> None:
    try:
        principal = await gw.auth.authenticate(key_from_request(ws))
    except Overloaded as exc:
        await _refuse(gw, ws, exc, 1013)  # "try again later": a service behind us is down
        return
    except FirstTokenError as exc:
        await _refuse(gw, ws, exc, 1008)
        return
    except Exception:  # a bug: the client still gets a frame before the close
        log.exception("authenticating a websocket failed")
        internal = InternalError(
            "internal error; the key could not be checked (see the server log)"
        )
        await _refuse(gw, ws, internal, 1011)
        return
    session = Session(gw, ws, principal)
    gw.sessions.add(session)
    gw.metrics.connections.inc()
    try:
        await session.run()
    finally:
        gw.sessions.discard(session)
        gw.metrics.connections.dec()


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """200 only when Redis, the database and at least one chat worker answer."""
    gw: Gateway = request.app.state.gateway
    checks: dict[str, str] = {}

    async def check(name: str, probe: asyncio.Future[object] | object) -> None:
        try:
            await asyncio.wait_for(probe, READY_CHECK_TIMEOUT_S)  # type: ignore[arg-type]
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks[name] = f"failed: {type(exc).__name__}: {exc}"[:300]

    await asyncio.gather(check("redis", gw.redis.ping()), check("database", db_ping(gw.db)))
    workers = 0
    if checks["redis"] == "ok":
        gw._workers_checked = 0.0  # readiness wants a fresh answer
        workers = await gw.chat_workers()
    checks["chat_workers"] = (
        "ok"
        if workers
        else ("failed: no chat worker heartbeat (start `firsttoken worker --queues chat`)")
    )
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {
            "status": "ready" if ok else "not ready",
            "checks": checks,
            "chat_workers": workers,
            # Which process answered, where several share a port (gateway --reuse-port).
            "gateway": gw.name,
        },
        status_code=200 if ok else 503,
    )


async def metrics(request: Request) -> Response:
    """Every process of this host in multiprocess mode (FIRSTTOKEN_METRICS_DIR), else this
    one; plus the queue depths, read from Redis for this scrape."""
    gw: Gateway = request.app.state.gateway
    gw.metrics.flush_frames()  # this process's frames up to now (the rest at each tick)
    depths = await queue_depths(gw.redis, gw.keys)
    text = gw.chat_metrics.exposition([gw.metrics.registry], depths)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def _refused(request: Request) -> Response | None:
    """The OpenAI-shaped refusal of a request without a valid API key (401; 503 with
    Retry-After when the key cannot be checked, the database down), or None."""
    gw: Gateway = request.app.state.gateway
    try:
        await gw.auth.authenticate(key_from_request(request))
    except FirstTokenError as exc:
        gw.metrics.errors.labels(exc.code.value).inc()
        return error_response(exception_reply(exc))
    return None


async def list_models(request: Request) -> Response:
    """The model table, OpenAI-style (`{"object": "list", "data": [...]}`); needs an API key,
    as OpenAI's own /v1/models does."""
    gw: Gateway = request.app.state.gateway
    return await _refused(request) or JSONResponse(gw.models.public())


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{id}`: one model object (the SDKs' `models.retrieve`), or a 404 in
    OpenAI's shape naming the known ones."""
    gw: Gateway = request.app.state.gateway
    refused = await _refused(request)
    if refused is not None:
        return refused
    model_id = request.path_params["model_id"]
    for model in gw.models.public()["data"]:
        if model["id"] == model_id:
            return JSONResponse(model)
    known = ", ".join(gw.models.names)
    message = f"the model {model_id[:128]!r} does not exist; known models: {known}"
    return error_response(error_reply("model_not_found", message, param="model", status=404))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 (and any HTTPException): OpenAI's error shape under `/v1/`,
    where every client is an OpenAI SDK; Starlette's plain text elsewhere."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if request.url.path.startswith("/v1/"):
        reply = http_error_reply(exc.status_code, request.method, request.url.path)
        return error_response(reply, headers)
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=headers)


async def chat_page(request: Request) -> Response:
    # Same-origin only: the page talks to this gateway and loads nothing from elsewhere.
    csp = "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
    return FileResponse(PAGE_DIR / "index.html", headers={"content-security-policy": csp})


class Doors:
    """The ASGI app the gateway serves: the two chat doors' routes (`ws /v1/ws`, `POST
    /v1/chat/completions`) go straight to their handlers; every other request, and the
    lifespan, through the Starlette app (its router, error pages, static files).

    Why: Starlette's middleware and router are some ten calls per request, and its error
    middleware wraps `send`, so every token of the HTTP door passed two more layers. On the
    first token's path at one stream each layer counts several times its cost on a busy
    process: code that has not run for the 20 ms between tokens runs from cold caches
    (docs/benchmarks.md). The two handlers need neither layer: they answer their own errors.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app

    # The doors get `scope["app"]` as under Starlette, but no `router`, `endpoint` or
    # `path_params`: neither reads them (`request.url_for` would need the router).

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope.get("root_path"):  # mounted under a prefix: Starlette's routing knows it
            path = None
        if path == "/v1/ws" and scope["type"] == "websocket":
            scope["app"] = self.app  # what Starlette sets: the handlers read the gateway there
            await websocket_endpoint(WebSocket(scope, receive, send))
        elif (
            path == "/v1/chat/completions" and scope["type"] == "http" and scope["method"] == "POST"
        ):
            scope["app"] = self.app
            await _chat_completions(scope, receive, send)
        else:
            await self.app(scope, receive, send)


async def _chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
    """`POST /v1/chat/completions` without Starlette's layers. The handler answers every error
    of the request as OpenAI does; anything else it raises (a bug) gets a 500 in OpenAI's shape
    and one log line with its traceback. An error raised by the response object itself is
    uvicorn's, as it was under Starlette: a plain 500 if nothing was sent yet, else the
    connection closed, and its log line."""
    try:
        response = await chat_completions(Request(scope, receive))
    except Exception:
        log.exception("POST /v1/chat/completions failed")
        internal = InternalError("internal error; the request failed (see the server log)")
        response = error_response(exception_reply(internal))
    await response(scope, receive, send)


def create_app(settings: Settings | None = None) -> Doors:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw = Gateway(settings)
        await gw.start()
        app.state.gateway = gw
        freeze_startup_objects()  # full GC passes off the relay path (shared/heap.py)
        try:
            yield
        finally:
            await gw.close()

    starlette = Starlette(
        routes=[
            WebSocketRoute("/v1/ws", websocket_endpoint),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/v1/models", list_models),
            Route("/v1/models/{model_id:path}", retrieve_model),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", response_item, methods=["GET", "DELETE"]),
            Route("/", chat_page),
            Mount("/page", StaticFiles(directory=PAGE_DIR), name="page"),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )
    return Doors(starlette)
