"""Hosts for the cluster test bed: each a Linux network namespace with its own address on one
bridge, as machines on one LAN. The machine's own namespace is the bridge's first address:
the tests (and the PostgreSQL forward) reach every host from there.

No host has a route off the bridge: a lookup of a name outside /etc/hosts fails at once
instead of waiting on a DNS server it cannot reach.

Needs root (``ip netns add``); :func:`can_make_namespaces` says why not where it cannot.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str

    @property
    def run_in(self) -> list[str]:
        """The command prefix that runs a process on this host."""
        return ["ip", "netns", "exec", self.name]

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=10
        ).stdout
        return [int(p) for p in out.split()]


class Network:
    """A bridge ``<tag>br`` on 10.<subnet>.0/24 and one namespace per host on it."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.tag = tag
        self.prefix = f"10.{subnet // 256}.{subnet % 256}"
        self.bridge = f"{tag}br"
        self.gateway = f"{self.prefix}.1"  # the machine's own address on the bridge
        self.hosts: dict[str, Host] = {}
        self._numbers: list[int] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str, number: int) -> Host:
        """Host ``name`` at .number: a namespace, a veth pair into the bridge, loopback up."""
        ns = f"{self.tag}-{name}"
        outer = f"{self.tag}{number}"  # interface names are at most 15 characters
        _ip("netns", "add", ns)
        host = Host(ns, f"{self.prefix}.{number}")
        self.hosts[name] = host
        self._numbers.append(number)
        _ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", outer, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Remove every host's veth pair, namespace, and the bridge. The pair goes first: a
        namespace outlives its deletion while orphaned TCP sockets in it retry their FINs
        (minutes), and its interface with it."""
        for number in self._numbers:
            subprocess.run(["ip", "link", "del", f"{self.tag}{number}"], capture_output=True,
                           timeout=10)  # fmt: skip
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)


def can_make_namespaces() -> str | None:
    """None when network namespaces and bridges can be made here, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces with"
    probe = "ftprobe"
    try:
        _ip("netns", "add", probe)
    except subprocess.SubprocessError as exc:
        detail = getattr(exc, "stderr", "") or exc
        return f"cannot make a network namespace (`ip netns add`: {str(detail).strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    try:
        _ip("link", "add", f"{probe}br", "type", "bridge")
    except subprocess.SubprocessError as exc:
        detail = getattr(exc, "stderr", "") or exc
        return f"cannot make a bridge (`ip link add type bridge`: {str(detail).strip()})"
    subprocess.run(["ip", "link", "del", f"{probe}br"], capture_output=True, timeout=10)
    return None


def leftovers(tag_start: str) -> Sequence[str]:
    """Namespaces of earlier beds (``ip netns list`` names starting with ``tag_start``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag_start)]
