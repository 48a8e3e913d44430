"""A Redis primary, its replica and three Sentinels of a test's own, as real processes.

Used by the Sentinel failover test (tests/faults/test_sentinel_failover.py) on 127.0.0.1 and
by the cluster test bed (tests/cluster/), where each server runs in a host's network
namespace (``run_in``: the command prefix that puts a process there). Skips the test where
there is no redis-server binary; a Sentinel is ``redis-sentinel`` (Debian's package) or
``redis-server --sentinel``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.support import free_port, wait_until

MASTER = "mymaster"
# Sentinel calls the primary down after this long without an answer: a failover then takes
# about this plus an election (a second or two).
DOWN_AFTER_MS = 1000


@dataclass
class Server:
    host: str
    port: int
    proc: subprocess.Popen[bytes]

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=2, decode_responses=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class SentinelGroup:
    """A primary and a replica watched by three Sentinels (quorum 2)."""

    servers: list[Server]
    sentinels: list[Server]
    workdir: Path

    @property
    def url(self) -> str:
        """FIRSTTOKEN_REDIS_URL for this group (kombu's form, plus the master's name)."""
        parts = ";".join(f"sentinel://{s.host}:{s.port}" for s in self.sentinels)
        return f"{parts}/0?master_name={MASTER}&socket_connect_timeout=1"

    def master(self) -> tuple[str, int]:
        """The master as a live Sentinel names it."""
        for sentinel in self.sentinels:
            if sentinel.proc.poll() is not None:
                continue
            try:
                with sentinel.client() as client:
                    host, port = client.execute_command(
                        "SENTINEL", "get-master-addr-by-name", MASTER
                    )
                return str(host), int(port)
            except redis.RedisError:
                continue
        raise ConnectionError("no Sentinel answers")

    def master_server(self) -> Server:
        host, port = self.master()
        return next(s for s in self.servers if (s.host, s.port) == (host, port))

    def settled(self) -> bool:
        """Every live Sentinel knows the master, a replica and the other live Sentinels."""
        live = [s for s in self.sentinels if s.proc.poll() is None]
        try:
            for sentinel in live:
                with sentinel.client() as client:
                    info = client.sentinel_master(MASTER)
                    if info["num-slaves"] < 1 or info["num-other-sentinels"] < len(live) - 1:
                        return False
                    if info["is_sdown"] or info["is_odown"]:
                        return False
            return True
        except (redis.RedisError, KeyError):
            return False

    def failover(self) -> tuple[str, int]:
        """Kill the master's process (SIGKILL) and wait until the Sentinels promoted the
        replica and it answers as master; returns the new master."""
        old = self.master_server()
        old.kill()
        new = next(s for s in self.servers if s is not old)

        def promoted() -> bool:
            try:
                with new.client() as client:
                    role = client.execute_command("ROLE")[0]
                return self.master() == (new.host, new.port) and role == "master"
            except (redis.RedisError, ConnectionError):
                return False

        wait_until(promoted, 30, 0.1, what="the Sentinels to promote the replica")
        return new.host, new.port

    def close(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            if server.proc.poll() is None:
                server.proc.terminate()
        for server in [*self.sentinels, *self.servers]:
            try:
                server.proc.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()


def _binaries() -> tuple[str, list[str]]:
    import pytest

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("no redis-server binary on this machine (the Sentinel tests need one)")
    sentinel = shutil.which("redis-sentinel")
    return server, [sentinel] if sentinel else [server, "--sentinel"]


def _started(run_in: Sequence[str], args: list[str], host: str, port: int, log: Path) -> Server:
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([*run_in, *args], stdout=out, stderr=subprocess.STDOUT)
    server = Server(host, port, proc)

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} on {host}:{port} exited: {log.read_text()[-2000:]}")
        try:
            with server.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    wait_until(answers, 15, 0.05, what=f"{args[0]} on {host}:{port}")
    return server


def sentinel_group(
    workdir: Path,
    hosts: Sequence[str] = ("127.0.0.1",) * 5,
    run_in: Sequence[Sequence[str]] = ((),) * 5,
    ports: Sequence[int] | None = None,
) -> SentinelGroup:
    """Start primary, replica and 3 Sentinels on ``hosts`` (5 of them, in that order), each
    under its ``run_in`` prefix, and wait until the Sentinels agree on the group."""
    server_bin, sentinel_cmd = _binaries()
    ports = list(ports) if ports is not None else [free_port() for _ in range(5)]
    servers: list[Server] = []
    sentinels: list[Server] = []
    group = SentinelGroup(servers, sentinels, workdir)
    try:
        for i in range(2):
            data = workdir / f"redis{i}"
            data.mkdir(parents=True, exist_ok=True)
            args = [server_bin, "--port", str(ports[i]), "--bind", hosts[i], "--save", "",
                    "--appendonly", "no", "--dir", str(data), "--protected-mode", "no"]  # fmt: skip
            if i == 1:
                args += ["--replicaof", hosts[0], str(ports[0])]
            servers.append(_started(run_in[i], args, hosts[i], ports[i], data / "log"))
        for i in range(3):
            conf = workdir / f"sentinel{i}.conf"
            conf.write_text(
                f"port {ports[2 + i]}\nbind {hosts[2 + i]}\nprotected-mode no\n"
                f"dir {workdir}\n"
                f"sentinel monitor {MASTER} {hosts[0]} {ports[0]} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            log = workdir / f"sentinel{i}.log"
            sentinels.append(_started(run_in[2 + i], [*sentinel_cmd, str(conf)], hosts[2 + i],
                                      ports[2 + i], log))  # fmt: skip
        # Sentinels find each other and the replica through the primary (hello messages
        # every 2 s): a failover needs them to.
        wait_until(group.settled, 30, 0.2, what="the Sentinels to find each other")
    except BaseException:
        group.close()
        raise
    return group


def wait_replicated(group: SentinelGroup, timeout: float = 10.0) -> None:
    """Wait until the replica has everything the master has (offsets equal)."""
    master = group.master_server()
    replica = next(s for s in group.servers if s is not master)

    def caught_up() -> bool:
        with master.client() as m, replica.client() as r:
            return int(m.info("replication")["master_repl_offset"]) <= int(
                r.info("replication").get("slave_repl_offset", -1)
            )

    wait_until(caught_up, timeout, 0.05, what="the replica to catch up")
