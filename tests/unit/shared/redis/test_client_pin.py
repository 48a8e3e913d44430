"""shared/redis/client.py subclasses redis-py's connections: the pin in pyproject.toml and the
redis-py code the override leans on are checked here, so an upgrade fails loudly instead of
quietly losing the override (or breaking every ordinary command)."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import redis
from packaging.requirements import Requirement
from redis.asyncio.connection import AbstractConnection, Connection

from shared.redis.client import TcpConnection, TlsConnection, UnixConnection, redis_client

ROOT = Path(__file__).resolve().parents[4]
RECHECK = (
    "re-check shared/redis/client.py (_WriteWithoutTask): it assumes that "
    "AbstractConnection.send_packed_command(command, check_health) bounds the write with "
    "asyncio.wait_for(..., self.socket_timeout) only when socket_timeout is set, and writes "
    "without a task when it is None; then widen the redis pin in pyproject.toml"
)


def _pin() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "redis"]
    assert len(pins) == 1, "pyproject.toml names redis-py once, pinned"
    return pins[0]


def test_redis_py_is_pinned_to_a_range_and_the_installed_one_is_in_it() -> None:
    pin = _pin()
    assert any(s.operator == "<" for s in pin.specifier), f"{pin}: an upper bound; {RECHECK}"
    assert pin.specifier.contains(redis.__version__), (
        f"redis-py {redis.__version__} is installed, outside the pin {pin}; {RECHECK}"
    )


def test_send_packed_command_is_still_what_the_override_assumes() -> None:
    method = AbstractConnection.send_packed_command
    params = list(inspect.signature(method).parameters)
    assert params == ["self", "command", "check_health"], f"signature {params}; {RECHECK}"
    source = inspect.getsource(method)
    for needle in ("if self.socket_timeout:", "asyncio.wait_for(", "self._writer.drain()"):
        assert needle in source, f"redis-py {redis.__version__}: {needle!r} is gone; {RECHECK}"


def test_each_url_scheme_gets_its_connection_class() -> None:
    for url, cls in (
        ("redis://127.0.0.1:6379/0", TcpConnection),
        ("unix:///tmp/redis.sock?db=0", UnixConnection),
        ("rediss://127.0.0.1:6380/0", TlsConnection),
    ):
        assert redis_client(url).connection_pool.connection_class is cls
    assert issubclass(TcpConnection, Connection)
