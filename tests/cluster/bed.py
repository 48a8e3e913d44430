"""The cluster test bed: the stack spread over hosts, as a production deployment is.

Each host is a network namespace on one bridge (tests/cluster/netns.py):

    lb      HAProxy on :8080, websocket-aware, health-checking each gateway's /readyz
    gw1 gw2 a gateway each, on :8000
    chat1 chat2
            a chat worker each, with its own simulated engine on the host's loopback (the
            engine's capacity is per host, as a GPU's is)
    bulk    the bulk worker, and the third Sentinel
    redis1  the Redis primary and a Sentinel;  redis2  its replica and a Sentinel
    PostgreSQL: the machine's, forwarded onto the bridge's own address (a server on
            127.0.0.1 is not reachable from a namespace)

Every process is a real one; every Redis client is given the Sentinel URL. ``python -m
tests.cluster.bed up`` (scripts/cluster.sh) brings one up for people to try.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from firsttoken.procs import Child
from tests.cluster.netns import Host, Network
from tests.integration.conftest import STACK_SETTINGS, Services, Stack
from tests.integration.test_persist_outage import TcpProxy
from tests.sentinels import SentinelGroup, sentinel_group
from tests.support import port_open, wait_until

HOSTS = {"lb": 10, "gw1": 11, "gw2": 12, "chat1": 21, "chat2": 22, "bulk": 31,
         "redis1": 41, "redis2": 42}  # fmt: skip
GATEWAYS = ("gw1", "gw2")
CHAT_HOSTS = ("chat1", "chat2")
GATEWAY_PORT = 8000
LB_PORT = 8080
SIM_PORT = 8100
# An engine slower than a cache lookup (as a real model is); answers of up to 64 tokens 40 ms
# apart, long enough to lose a host in the middle of one.
SIM_ARGS = ("--ttft-ms", "200", "--itl-ms", "40", "--max-tokens", "64")

# Over the single-host stack's: a client of a killed gateway host has 5 s to reconnect
# through HAProxy and resume; a chat worker rides out a Redis failover.
BED_SETTINGS = {
    "gateway_dead_after_s": "5",
    "worker_redis_outage_s": "30",
    "queue_deadline_s": "10",
    "stream_idle_timeout_s": "5",
    "cache_max_temperature": "0.5",
}

HAPROXY_CFG = """\
global
    maxconn 4096
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    # A websocket is a tunnel once upgraded: it lives as long as the client keeps it.
    timeout tunnel 1h
    option redispatch
    retries 2
frontend chat
    bind {lb}:{lb_port}
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1
{servers}
"""


@dataclass
class Bed:
    net: Network
    group: SentinelGroup
    stack: Stack
    db_proxy: TcpProxy
    workdir: Path
    sim_args: tuple[str, ...] = SIM_ARGS
    down: set[str] = field(default_factory=set)

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    @property
    def ws_url(self) -> str:
        """The chat websocket through HAProxy."""
        return f"ws://{self.host('lb').address}:{LB_PORT}/v1/ws"

    @property
    def lb_http(self) -> str:
        return f"http://{self.host('lb').address}:{LB_PORT}"

    def gateway_ws(self, name: str) -> str:
        """The chat websocket of one gateway host, past HAProxy."""
        return f"ws://{self.host(name).address}:{GATEWAY_PORT}/v1/ws"

    # --- hosts ------------------------------------------------------------------------------
    def start_gateway(self, name: str) -> None:
        host = self.host(name)
        self.stack.start(name, ["-m", "gateway", "--host", host.address,
                                "--port", str(GATEWAY_PORT)], host.run_in)  # fmt: skip
        wait_until(lambda: port_open(GATEWAY_PORT, host.address), 60, what=f"gateway on {name}")
        self.down.discard(name)

    def start_chat_host(self, name: str) -> None:
        """The host's engine, then its chat worker (waits for the worker's heartbeat)."""
        host = self.host(name)
        self.stack.start(f"sim-{name}", ["-m", "firsttoken.simserver", "--port", str(SIM_PORT),
                                         *self.sim_args], host.run_in)  # fmt: skip
        self.stack.start_worker(name, "chat", host.run_in)
        self.stack.wait_worker(name)
        self.down.discard(name)

    def kill_host(self, name: str) -> None:
        """The host is lost: SIGKILL to every process in its namespace at once."""
        for pid in self.host(name).pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: not self.host(name).pids(), 10, what=f"{name}'s processes to die")
        for child_name, child in list(self.stack.procs.items()):
            if child_name in (name, f"sim-{name}"):
                child.kill()  # reaped, its log closed
        self.down.add(name)

    def close(self) -> None:
        try:
            self.stack.close()
        finally:
            self.group.close()
            self.db_proxy.close()
            self.net.close()


def _haproxy(net: Network, stack: Stack, workdir: Path) -> Child:
    servers = "\n".join(
        f"    server {name} {net.hosts[name].address}:{GATEWAY_PORT} check" for name in GATEWAYS
    )
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(lb=net.hosts["lb"].address, lb_port=LB_PORT,
                                      servers=servers))  # fmt: skip
    child = Child([*net.hosts["lb"].run_in, "haproxy", "-db", "-f", str(cfg)], os.environ.copy(),
                  workdir / "haproxy.log")  # fmt: skip
    stack.procs["haproxy"] = child
    return child


def bring_up(
    workdir: Path,
    database_url: str,
    api_key: str,
    *,
    tag: str | None = None,
    settings: dict[str, str] | None = None,
    sim_args: tuple[str, ...] = SIM_ARGS,
) -> Bed:
    """Every host, started in dependency order; returns once HAProxy answers /readyz."""
    from sqlalchemy import make_url

    tag = tag or f"ft{uuid.uuid4().hex[:4]}"
    subnet = 256 * 200 + int(uuid.uuid4().hex[:2], 16)  # 10.200.x.0/24, x random
    net = Network(tag, subnet)
    bed: Bed | None = None
    try:
        for name, number in HOSTS.items():
            net.add(name, number)
        h = net.hosts
        redis_dir = workdir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        group = sentinel_group(
            redis_dir,
            hosts=[h[n].address for n in ("redis1", "redis2", "redis1", "redis2", "bulk")],
            run_in=[h[n].run_in for n in ("redis1", "redis2", "redis1", "redis2", "bulk")],
            ports=[6379, 6379, 26379, 26379, 26379],
        )
        url = make_url(database_url)
        proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432), bind=net.gateway)
        on_bed = url.set(host=net.gateway, port=proxy.port).render_as_string(hide_password=False)
        values = {
            **STACK_SETTINGS,
            **BED_SETTINGS,
            "engine": "openai",
            "engine_url": f"http://127.0.0.1:{SIM_PORT}/v1",
            **(settings or {}),
        }
        logs = workdir / "logs"
        logs.mkdir(exist_ok=True)
        stack = Stack(Services(group.url, on_bed, []), f"fttest{tag}", logs, values)
        stack.api_key = api_key
        bed = Bed(net, group, stack, proxy, workdir, sim_args)
        stack.start_worker("bulk", "bulk", h["bulk"].run_in)
        for name in CHAT_HOSTS:
            bed.start_chat_host(name)
        for name in GATEWAYS:
            bed.start_gateway(name)
        _haproxy(net, stack, workdir)
        wait_until(lambda: _status(bed.lb_http + "/readyz") == 200, 60, what="HAProxy /readyz")
        return bed
    except BaseException:
        if bed is not None:
            for name, proc in bed.stack.procs.items():
                print(f"--- {name} log ---\n{proc.tail(2000)}")
            bed.close()
        else:
            net.close()
        raise


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _main() -> int:
    """``up``: bring a bed up on a fresh database, print where, wait for Ctrl-C, take it
    down. ``down``: remove what a bed that was not taken down left (namespaces, bridge)."""
    import argparse
    import asyncio
    import tempfile

    from tests.cluster.netns import leftovers
    from tests.integration.conftest import _migrate_and_key
    from tests.support import postgres_database

    parser = argparse.ArgumentParser(
        prog="scripts/cluster.sh",
        description="A firsttoken cluster on this machine: hosts as network namespaces, "
        "HAProxy, Redis with Sentinels (needs root, haproxy, redis-sentinel, PostgreSQL).",
    )
    parser.add_argument("action", choices=["up", "down"], help="bring the bed up, or clean up")
    args = parser.parse_args()
    if args.action == "down":
        for ns in leftovers("ftc"):
            for pid in Host(ns, "").pids():
                os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], check=False)
        out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith("ftc"):  # the veth pairs (see Network.close) and the bridge
                subprocess.run(["ip", "link", "del", name], check=False)
        return 0
    # SIGTERM (a `kill`, `timeout`) takes the bed down as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="firsttoken-cluster-"))
    with postgres_database() as database_url:
        key = _migrate_and_key(database_url)
        bed = bring_up(workdir, database_url, key, tag=f"ftc{uuid.uuid4().hex[:2]}")
        try:
            print(f"chat websocket (HAProxy): {bed.ws_url}\nAPI key: {key}")
            for name, host in bed.net.hosts.items():
                print(f"  {name:7} {host.address:15} ip netns exec {host.name} ...")
            print(f"FIRSTTOKEN_REDIS_URL={bed.group.url}\nlogs: {workdir}\nCtrl-C takes it down")
            asyncio.run(asyncio.Event().wait())
        except KeyboardInterrupt:
            pass
        finally:
            bed.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
