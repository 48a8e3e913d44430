"""rediss:// URLs on the seam's connections, against the machine's Redis behind a TLS proxy (the
stunnel set-up; this Redis is built without TLS): the certificate is checked as redis-py checks
it, and the pipe, the subscriber and redis-py's client all read the same URL."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.redis.address import RedisAddress
from shared.redis.client import redis_client
from shared.redis.connection import RedisConnection
from shared.redis.pipe import RedisPipe
from shared.redis.pubsub import Subscriber
from tests.integration.conftest import Services


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a test certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
async def tls_port(services: Services, tmp_path: Path) -> AsyncIterator[tuple[int, Path]]:
    """A TLS endpoint on localhost that forwards to the machine's Redis; yields its port and
    the certificate that signs it."""
    target = RedisAddress.from_url(services.redis_url)
    if target.path is not None or target.tls is not None:
        pytest.skip("the proxy forwards to a plain TCP Redis")
    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    pumps: set[asyncio.Task[None]] = set()

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def forward(client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        redis_in, redis_out = await asyncio.open_connection(target.host, target.port)
        for task in (pump(client_in, redis_out), pump(redis_in, client_out)):
            pumps.add(asyncio.create_task(task))

    server = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], cert
    finally:
        server.close()
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await server.wait_closed()


async def test_every_connection_of_the_seam_speaks_tls(tls_port: tuple[int, Path]) -> None:
    port, cert = tls_port
    url = f"rediss://localhost:{port}/0?ssl_ca_certs={cert}"
    channel = f"fttls{uuid.uuid4().hex[:8]}"

    conn = await RedisConnection.open(url, client_name="fttls-conn")
    try:
        assert await conn.call("PING") == b"PONG"
    finally:
        await conn.aclose()

    pipe = RedisPipe(url, client_name="fttls-pipe")
    subscriber = Subscriber(url, client_name="fttls-sub")
    client = redis_client(url)
    try:
        await pipe.start()
        await subscriber.start()
        got: list[str] = []
        await subscriber.subscribe_confirmed(channel, got.append)
        assert await pipe.call("PUBLISH", channel, "über tls") == 1
        assert await client.publish(channel, "redis-py too") == 1
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert got == ["über tls", "redis-py too"]
    finally:
        await client.aclose()
        await subscriber.close()
        await pipe.close(grace_s=0.5)


async def test_a_certificate_nobody_vouches_for_is_refused_unless_told_not_to_check(
    tls_port: tuple[int, Path],
) -> None:
    port, _cert = tls_port
    with pytest.raises(ssl.SSLCertVerificationError):
        await RedisConnection.open(f"rediss://localhost:{port}/0")
    conn = await RedisConnection.open(f"rediss://localhost:{port}/0?ssl_cert_reqs=none")
    try:
        assert await conn.call("PING") == b"PONG"
    finally:
        await conn.aclose()
