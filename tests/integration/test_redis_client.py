"""shared/redis/client.py: the same commands and errors as redis-py, without a task per write."""

from __future__ import annotations

import uuid

from shared.redis.client import TcpConnection, redis_client
from tests.integration.conftest import Services


async def test_commands_scripts_and_pipelines_work(services: Services) -> None:
    client = redis_client(services.redis_url)
    key = f"ftclient{uuid.uuid4().hex[:8]}"
    try:
        assert await client.set(key, "ü", ex=30)
        assert await client.get(key) == "ü"
        script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        await client.delete(key)
        assert await script(keys=[key], args=[5]) == 5
        async with client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.get(key)
            assert await pipe.execute() == [6, "6"]
        conn = await client.connection_pool.get_connection()
        try:
            assert isinstance(conn, TcpConnection) and conn.socket_timeout
            timeout = conn.socket_timeout
            await conn.send_command("PING")
            assert await conn.read_response() == "PONG"
            assert conn.socket_timeout == timeout  # restored after the write
        finally:
            await client.connection_pool.release(conn)
    finally:
        await client.delete(key)
        await client.aclose()
