"""gateway/app.py Doors: the chat doors' routes reach their handlers without Starlette's layers,
every other request reaches Starlette, and a bug in the HTTP door still gets its 500."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, cast

import orjson
import pytest
from starlette.applications import Starlette

import gateway.app as app_module
from gateway.app import Doors


class _Inner:
    """Stands in for the Starlette app: records the requests it was handed."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope.get("path", scope["type"]))


def _http(method: str, path: str, root_path: str = "") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": root_path,
        "headers": [],
        "query_string": b"",
    }


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def _ignore(message: MutableMapping[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    "scope",
    [
        _http("GET", "/v1/chat/completions"),  # its 405, in OpenAI's shape, is Starlette's
        _http("POST", "/v1/responses"),
        _http("GET", "/healthz"),
        _http("POST", "/v1/chat/completions", root_path="/api"),  # mounted: Starlette routes
        _http("POST", "/v1/chat/completions/"),  # Starlette's redirect without the slash
        {"type": "websocket", "path": "/v1/other", "root_path": ""},
        {"type": "websocket", "path": "/v1/ws/", "root_path": ""},
        {"type": "lifespan"},
    ],
)
async def test_everything_but_the_chat_doors_goes_through_starlette(scope: dict[str, Any]) -> None:
    inner = _Inner()
    await Doors(cast(Starlette, inner))(scope, _receive, _ignore)
    assert inner.paths == [scope.get("path", scope["type"])]


async def test_a_bug_in_the_http_door_is_a_500_in_openais_shape_and_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app_module, "chat_completions", broken)
    inner, sent = _Inner(), list[MutableMapping[str, Any]]()

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    with caplog.at_level(logging.ERROR, logger="gateway.app"):
        await Doors(cast(Starlette, inner))(_http("POST", "/v1/chat/completions"), _receive, send)
    assert inner.paths == []  # handled by the door itself
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 500
    error = orjson.loads(sent[1]["body"])["error"]
    assert error["type"] == "server_error" and "see the server log" in error["message"]
    assert [r.exc_info is not None for r in caplog.records] == [True]


async def test_the_websocket_door_gets_its_socket_and_starlettes_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[Any] = []

    async def endpoint(ws: Any) -> None:
        served.append(ws)

    monkeypatch.setattr(app_module, "websocket_endpoint", endpoint)
    inner = _Inner()
    scope = {"type": "websocket", "path": "/v1/ws", "root_path": "", "headers": []}
    await Doors(cast(Starlette, inner))(scope, _receive, _ignore)
    assert inner.paths == [] and len(served) == 1
    assert served[0].app is inner  # where the handlers read the running gateway
