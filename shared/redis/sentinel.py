"""Which server is the master now: asked of the Sentinels of a ``sentinel://`` URL.

:func:`master_of` is the one place a firsttoken process resolves a Sentinel URL to a server
(the pipe, the chat queue's reads and the pub/sub reader through
``connection.open_transport``, redis-py's client through its connection class in
``client.py``); only Celery's broker uses kombu's own Sentinel support, since kombu opens its
connections itself (``address.celery_broker_url``).

It follows Redis's Sentinel client spec: ask each Sentinel in turn ``SENTINEL
get-master-addr-by-name``, the last one that answered first; a Sentinel that is down or does
not know the master is skipped. A caller that connects to what it was told checks the
server's ``ROLE`` (:func:`check_master`): a Sentinel that has not yet heard of a failover
names the old master, now a replica, and the caller asks again. Resolution runs once per
connection opened, never per command: the connections are long-lived.
"""

from __future__ import annotations

import asyncio
import logging

from shared.redis.address import RedisAddress
from shared.redis.resp import error_text, pack, reply_parser

log = logging.getLogger(__name__)

# One Sentinel gets this long to answer before the next is asked: a Sentinel host that is
# gone (its packets dropped) would otherwise cost the whole connect timeout, and a failover
# must be survived within seconds; a live one on a busy host answers well within it.
SENTINEL_TIMEOUT_S = 1.0

# The Sentinel that answered last, per set of Sentinels: asked first next time (the spec's
# "move it to the head of the list").
_preferred: dict[tuple[tuple[str, int], ...], tuple[str, int]] = {}


class MasterNotFound(ConnectionError):
    """No Sentinel named a master for the URL's master name (all down, or none knows it)."""


async def master_of(address: RedisAddress) -> RedisAddress:
    """``address`` itself when it is no Sentinel URL, else the address of the master the
    Sentinels name now; raises :class:`MasterNotFound` saying what each Sentinel answered."""
    if not address.sentinels:
        return address
    order = list(address.sentinels)
    first = _preferred.get(address.sentinels)
    if first in order:
        order.remove(first)
        order.insert(0, first)
    failures = []
    for host, port in order:
        try:
            async with asyncio.timeout(min(SENTINEL_TIMEOUT_S, address.connect_timeout_s)):
                master = await _ask(host, port, address)
        except (OSError, TimeoutError, ConnectionError) as exc:
            failures.append(f"{host}:{port}: {exc or type(exc).__name__}")
            continue
        if master is None:
            failures.append(f"{host}:{port}: does not know {address.master_name!r}")
            continue
        _preferred[address.sentinels] = (host, port)
        return address.at(*master)
    raise MasterNotFound(
        f"no Sentinel named a master {address.master_name!r} ({'; '.join(failures)}); check "
        "the Sentinels are up and master_name in FIRSTTOKEN_REDIS_URL"
    )


async def _ask(host: str, port: int, address: RedisAddress) -> tuple[str, int] | None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        commands = []
        if address.sentinel_password is not None:
            commands.append(pack((b"AUTH", address.sentinel_password.encode())))
        commands.append(
            pack((b"SENTINEL", b"get-master-addr-by-name", address.master_name.encode()))
        )
        writer.writelines(commands)
        parser = reply_parser(decode=True)
        replies: list[object] = []
        while len(replies) < len(commands):
            data = await reader.read(4096)
            if not data:
                raise ConnectionError("closed the connection")
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                replies.append(reply)
        answer = replies[-1]
        for reply in replies:
            if isinstance(reply, Exception):
                raise ConnectionError(error_text(reply))
        if not isinstance(answer, list) or len(answer) != 2:
            return None  # nil: this Sentinel watches no master of that name
        return str(answer[0]), int(answer[1])
    finally:
        writer.close()


def check_master(role: object, address: RedisAddress) -> None:
    """Raise ConnectionError unless ``role`` (a ``ROLE`` reply) is a master's: the server a
    Sentinel named has been demoted since (the caller asks the Sentinels again)."""
    kind = role[0] if isinstance(role, list) and role else role
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind != "master":
        raise ConnectionError(
            f"Redis at {address.host}:{address.port} is a {kind}, not the master "
            f"{address.master_name!r} (a failover in progress); asking the Sentinels again"
        )
