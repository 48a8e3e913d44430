"""Helpers the integration tests share: free ports, child processes, fresh databases."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("FIRSTTOKEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN_URL = os.environ.get(
    "FIRSTTOKEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_until(
    predicate: object, timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")


def redis_available(url: str = REDIS_URL) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def postgres_available(url: str = POSTGRES_ADMIN_URL) -> bool:
    import asyncio

    import asyncpg

    async def _check() -> bool:
        conn = await asyncpg.connect(url, timeout=2)
        await conn.close()
        return True

    try:
        return asyncio.run(_check())
    except Exception:
        return False


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for one test run; yields its SQLAlchemy async URL."""
    import asyncio

    import asyncpg

    name = f"ft_test_{uuid.uuid4().hex[:12]}"

    async def _admin(sql: str) -> None:
        conn = await asyncpg.connect(POSTGRES_ADMIN_URL, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def child_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update({f"FIRSTTOKEN_{k.upper()}": v for k, v in values.items()})
    return env


def throwaway_redis_server(port: int, workdir: Path, *options: str) -> subprocess.Popen[bytes]:
    """A redis-server of the test's own on `port` (more `options` appended: a password, say),
    to stop and start at will; skips the test where there is no binary."""
    import pytest

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary on this machine")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), *options],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until(lambda: port_open(port), 10, what="redis-server")
    return proc
