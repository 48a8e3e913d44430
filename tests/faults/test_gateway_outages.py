"""Redis or the database down, seen from the gateway (issue 29): a chat sent meanwhile gets
`overloaded` with `retry_after_ms` (not `internal`), a new connection gets an `error` frame
before any close (or is served, where auth needs neither), and chats succeed again soon after
the service returns."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from shared.db.apikeys import provision_key
from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.integration.test_persist_outage import TcpProxy
from tests.support import free_port, throwaway_redis_server

pytestmark = pytest.mark.timeout(150)

OUTAGE_S = 12  # as issue 29 tried it


@pytest.fixture
async def opener() -> AsyncIterator[Any]:
    """Open websockets to a stack (closed after the test)."""
    opened: list[Any] = []

    async def _open(stack: Stack, key: str | None = None) -> Client:
        headers = {"Authorization": f"Bearer {key or stack.api_key}"}
        ws = await websockets.connect(stack.ws_url, additional_headers=headers, open_timeout=10)
        opened.append(ws)
        return Client(ws)

    yield _open
    for ws in opened:
        await ws.close()


async def _first_frame_or_close(ws: Any, timeout: float = 10) -> dict[str, Any]:
    """The first frame a new connection gets; fails on a close without one."""
    try:
        return dict(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
    except websockets.ConnectionClosed as exc:
        pytest.fail(f"closed without a frame: {exc!r}")


def _assert_overloaded(frame: dict[str, Any]) -> None:
    assert frame["type"] == "error" and frame["code"] == "overloaded", frame
    assert isinstance(frame.get("retry_after_ms"), int) and frame["retry_after_ms"] > 0, frame


async def _answered(client: Client, chat_id: str) -> dict[str, Any]:
    await client.chat(chat_id, max_tokens=4, cache=False)
    _, end = await client.until_end(chat_id, 15)
    return end


async def _answered_again_within(client: Client, seconds: float) -> float:
    """Retry a chat (as a client told `overloaded` would) until one is answered; seconds taken."""
    started = time.monotonic()
    for i in range(1000):
        end = await _answered(client, f"again{i}")
        if end["type"] == "done":
            return time.monotonic() - started
        _assert_overloaded(end)
        assert time.monotonic() - started < seconds, end
        await asyncio.sleep(end["retry_after_ms"] / 1000)
    raise AssertionError("unreachable")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[int, list[Any]]]:
    """A redis-server of this test's own: (port, [the running process]), restarted at will."""
    port = free_port()
    procs = [throwaway_redis_server(port, tmp_path)]
    try:
        yield port, procs
    finally:
        procs[-1].terminate()
        procs[-1].wait(10)


async def test_redis_down_means_overloaded_chats_and_error_frames_then_recovery(
    services: Services,
    migrated: str,
    tmp_path: Path,
    opener: Any,
    own_redis: tuple[int, list[Any]],
) -> None:
    """Gateway and worker on a redis-server stopped for 12 s: chats sent meanwhile get
    `overloaded` with `retry_after_ms` within a few seconds, the connection stays usable, a
    new connection is served or told why before any close; chats succeed soon after."""
    port, procs = own_redis
    unseen = await provision_key(services.database_url, f"t-{uuid.uuid4().hex[:6]}")
    on_own = Services(f"redis://127.0.0.1:{port}/0", services.database_url, [])
    with make_stack(on_own, migrated, tmp_path, bulk=False) as stack:
        stack.wait_ready()
        client = await opener(stack)
        assert (await _answered(client, "before"))["type"] == "done"

        procs[-1].terminate()
        procs[-1].wait(10)
        down_at = time.monotonic()
        try:
            for i in range(3):  # at once, and after the gateway has noticed
                sent = time.monotonic()
                end = await _answered(client, f"down{i}")
                _assert_overloaded(end)
                assert time.monotonic() - sent < 7, end  # the admission's own bound
                await asyncio.sleep(1.5)
            await client.send({"type": "ping", "id": "p"})
            assert (await client.next_for("p"))["type"] == "pong"

            # Served, a key this process has seen from its cache and a new one from the
            # database; their chats are told to retry.
            for key in (stack.api_key, unseen):
                fresh = await opener(stack, key=key)
                _assert_overloaded(await _answered(fresh, "fresh"))
        finally:
            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            procs.append(throwaway_redis_server(port, tmp_path))
        # Mostly the worker reconnecting its broker and beating again.
        assert await _answered_again_within(client, 15) < 15
        assert (await _answered(await opener(stack), "new-socket"))["type"] == "done"


async def test_redis_down_a_new_connection_whose_key_needs_redis_gets_an_error_frame(
    services: Services, tmp_path: Path, opener: Any, own_redis: tuple[int, list[Any]]
) -> None:
    """A key this gateway has not seen, while Redis and the database are both unreachable:
    `overloaded` with `retry_after_ms` before the close, not a bare 1006."""
    port, procs = own_redis
    on_own = Services(f"redis://127.0.0.1:{port}/0", "postgresql+asyncpg://u@127.0.0.1:1/x", [])
    with make_stack(on_own, "unused-key", tmp_path, workers=0, bulk=False, sim_args=()) as stack:
        procs[-1].terminate()
        procs[-1].wait(10)
        try:
            ws = (await opener(stack, key="ft-never-seen")).ws
            _assert_overloaded(await _first_frame_or_close(ws))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1013, ws.close_code  # "try again later"
        finally:
            procs.append(throwaway_redis_server(port, tmp_path))


async def test_database_down_an_unknown_key_gets_overloaded_and_a_cached_key_works(
    services: Services,
    migrated: str,
    tmp_path: Path,
    opener: Any,
    proxied_database: tuple[str, TcpProxy],
) -> None:
    """PostgreSQL unreachable: a key never seen gets `overloaded` with `retry_after_ms` before
    the close; a key already looked up keeps connecting and chatting; once the database is
    back the new key is served."""
    database_url, proxy = proxied_database
    unseen = await provision_key(services.database_url, f"t-{uuid.uuid4().hex[:6]}")
    on_proxy = Services(services.redis_url, database_url, [])
    with make_stack(on_proxy, migrated, tmp_path, bulk=False) as stack:
        stack.wait_ready()
        assert (await _answered(await opener(stack), "before"))["type"] == "done"

        proxy.down("refuse")
        try:
            ws = (await opener(stack, key=unseen)).ws
            _assert_overloaded(await _first_frame_or_close(ws))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1013, ws.close_code
            assert (await _answered(await opener(stack), "cached"))["type"] == "done"
        finally:
            proxy.up()
        assert (await _answered(await opener(stack, key=unseen), "unseen"))["type"] == "done"
