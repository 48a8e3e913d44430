"""A worker's Celery node name: unique by default, and never one a live worker already has.

The name is the key of everything a worker owns in Redis: its heartbeat in each queue's
`worker_heartbeats`, its status record, and (a chat worker) the leases of its chats
(`worker_jobs`, workers/chat/failover.py). Two live processes under one name would renew each
other's leases: when one dies, the other's heartbeat keeps its chats' lease alive and nobody
takes them over. So the default name carries the pid (`chat-4121@host`; under foreman or a
Heroku-style runner, whose environment names the Procfile process, `worker_chat.1-4121@host`),
and a worker refuses to start under a name whose heartbeat is fresh.

Unless that heartbeat is its own earlier incarnation's: the same host, and its pid runs nothing
(or is this very process, as in a restarted container). A worker restarted under its fixed name
right after a crash (systemd, a Procfile runner, a test) then waits until its predecessor is
lost and one beat more, so that other chat workers take the dead one's chats over first (they
are leased under the name, and a live name is never taken over), and starts.

The check is a read at start, not a lock: two workers started with the same explicit name in
the same second both pass it (a chat worker beats only once warm). Unique defaults are what
make that case rare; the check catches the common one, a second worker started beside a
running one with the same `--name`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from shared.keys import QUEUES, Keys
from shared.settings import Settings

# Set by foreman (`PS`, e.g. worker_chat.1) and Heroku-style runners (`DYNO`) to the Procfile
# process running this command.
PROCESS_NAME_VARS = ("PS", "DYNO")


def default_name(queues: list[str], environ: dict[str, str], pid: int) -> str:
    """`<label>-<pid>@%h`: the Procfile process name where the environment gives one, else
    the queues joined by '-'; Celery expands %h to the host name."""
    label = next((environ[v] for v in PROCESS_NAME_VARS if environ.get(v)), "-".join(queues))
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "worker"
    return f"{label}-{pid}@%h"


def node_name(name: str) -> str:
    """The node name Celery will use for `-n name` (%h, %n, %d expanded; `celery@` added to
    a name without '@')."""
    from celery.utils.nodenames import default_nodename, host_format

    return str(host_format(default_nodename(name)))


@dataclass(frozen=True, slots=True)
class LiveWorker:
    name: str
    age_s: float
    host: str | None
    pid: int | None

    def is_dead_predecessor(self, host: str, pid: int, running: Callable[[int], bool]) -> bool:
        """Whether this heartbeat is this process's own earlier incarnation, gone: it ran on
        `host` and its pid is `pid` or runs nothing."""
        if self.host != host or self.pid is None:
            return False
        return self.pid == pid or not running(self.pid)


def pid_running(pid: int) -> bool:
    """Whether `pid` is a running process on this host (a zombie, killed but not yet reaped by
    its parent, is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # pid (comm) state ...: comm may hold spaces and parentheses; the state follows
            # the last ')'.
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


async def find_live(settings: Settings, node: str) -> LiveWorker | None:
    """The worker named `node` if one beat within `worker_lost_s` (by Redis's clock), else
    None. Redis errors propagate."""
    from shared.redis.client import redis_client
    from workers.workerstatus import decode_status

    keys = Keys(settings.redis_prefix)
    client = redis_client(settings.redis_url, max_connections=1)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.time()
            for queue in QUEUES:
                pipe.zscore(keys.worker_heartbeats(queue), node)
            pipe.get(keys.worker_status(node))
            (seconds, micros), *beats, raw = await pipe.execute()
    finally:
        await client.aclose()
    now = int(seconds) + int(micros) / 1e6
    status = decode_status(raw) if raw is not None else None
    times = [float(b) for b in beats if b is not None]
    if status is not None:
        times.append(status.beat_at)
    if not times:
        return None
    age = now - max(times)
    if age > settings.worker_lost_s:
        return None
    return LiveWorker(
        node,
        max(age, 0.0),
        status.host if status else None,
        status.pid if status else None,
    )


def refusal(live: LiveWorker) -> str:
    """The one line a worker prints when it will not start under `live`'s name."""
    where = f" (pid {live.pid} on {live.host})" if live.pid is not None else ""
    return (
        f"firsttoken worker: a live worker is already named {live.name}{where}, heartbeat "
        f"{live.age_s:.1f}s ago; two workers under one name would keep each other's chats from "
        "being taken over. Give this one another --name, or leave --name out for a unique one."
    )


def procfile_environ() -> dict[str, str]:
    return {v: os.environ[v] for v in PROCESS_NAME_VARS if v in os.environ}
