"""`firsttoken workers [--json]`: every worker process by queue, as its heartbeats report it.

Each worker's heartbeat writes a status record (workers/workerstatus.py; workers/resources.py):
host, pid, queues, in-flight, capacity, chats done, engine errors. This command reads them
all in two round trips (the index, then every record) and prints them; nothing here writes.
A worker whose last beat is older than `worker_lost_s` (the age at which a chat worker's
chats are taken over) is marked stale; its record expires `worker_status_ttl_s` after that
beat and the worker then drops out of the list.

The read (:func:`read_workers`) and the formatting (:func:`as_table`, :func:`as_json`, pure
over a :class:`Snapshot`) are apart, so the formatting is tested on plain values.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from shared.keys import QUEUES, Keys
from shared.settings import Settings, get_settings
from workers.workerstatus import WorkerStatus, decode_status


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every status record found, and what they are judged against."""

    now: float  # Redis's clock (one clock for every worker's age, whoever runs the command)
    lost_s: float
    workers: tuple[WorkerStatus, ...]


async def read_workers(settings: Settings) -> Snapshot:
    """The records of every worker that beat within `worker_status_ttl_s` (Redis errors
    propagate: the caller says Redis cannot be reached)."""
    from shared.redis.client import redis_client

    keys = Keys(settings.redis_prefix)
    client = redis_client(settings.redis_url, max_connections=1)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(keys.worker_statuses, 0, -1)
            (seconds, micros), names = await pipe.execute()
        raws = await client.mget([keys.worker_status(n) for n in names]) if names else []
    finally:
        await client.aclose()
    # A name whose record expired (or cannot be read) is left out: the index lags its TTL.
    found = (decode_status(raw) for raw in raws if raw is not None)
    workers = tuple(status for status in found if status is not None)
    return Snapshot(int(seconds) + int(micros) / 1e6, settings.worker_lost_s, workers)


def by_queue(snapshot: Snapshot) -> list[tuple[str, WorkerStatus]]:
    """(queue, worker) for every queue each worker serves: the stack's queues in their order,
    then any other, each by worker name."""
    order = {queue: i for i, queue in enumerate(QUEUES)}
    pairs = [(queue, w) for w in snapshot.workers for queue in w.queues]
    return sorted(pairs, key=lambda p: (order.get(p[0], len(order)), p[0], p[1].name))


def summary(snapshot: Snapshot) -> dict[str, dict[str, int]]:
    """Per queue: workers listed, those alive, and the alive ones' in-flight and capacity."""
    out: dict[str, dict[str, int]] = {
        q: {"workers": 0, "alive": 0, "in_flight": 0, "capacity": 0} for q in QUEUES
    }
    for queue, w in by_queue(snapshot):
        row = out.setdefault(queue, {"workers": 0, "alive": 0, "in_flight": 0, "capacity": 0})
        row["workers"] += 1
        if not w.stale(snapshot.now, snapshot.lost_s):
            row["alive"] += 1
            row["in_flight"] += w.in_flight
            row["capacity"] += w.capacity
    return out


def worker_dict(snapshot: Snapshot, w: WorkerStatus) -> dict[str, Any]:
    """One worker as `--json` prints it: its record, its heartbeat's age and whether stale."""
    record = w.model_dump(exclude={"v"})
    record["queues"] = list(w.queues)
    age = w.age_s(snapshot.now)
    return {**record, "heartbeat_age_s": round(age, 3), "stale": age > snapshot.lost_s}


def as_json(snapshot: Snapshot) -> str:
    workers = sorted(snapshot.workers, key=lambda w: (w.queues, w.name))
    return json.dumps(
        {
            "now": snapshot.now,
            "lost_after_s": snapshot.lost_s,
            "queues": summary(snapshot),
            "workers": [worker_dict(snapshot, w) for w in workers],
        },
        indent=2,
    )


COLUMNS = (
    "QUEUE",
    "WORKER",
    "HOST",
    "PID",
    "IN FLIGHT",
    "CAPACITY",
    "HEARTBEAT",
    "DONE",
    "ENGINE ERRORS",
)


def _age(age_s: float, stale: bool) -> str:
    text = f"{age_s:.1f}s ago"
    return f"{text} STALE" if stale else text


def as_table(snapshot: Snapshot) -> str:
    """One row per worker and queue, then one line per queue."""
    rows = [
        (
            queue,
            w.name,
            w.host,
            str(w.pid),
            str(w.in_flight),
            str(w.capacity),
            _age(w.age_s(snapshot.now), w.stale(snapshot.now, snapshot.lost_s)),
            str(w.done),
            str(w.engine_errors),
        )
        for queue, w in by_queue(snapshot)
    ]
    lines: list[str] = []
    if rows:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        for row in (COLUMNS, *rows):
            lines.append(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )
        lines.append("")
    else:
        lines.append("no worker has sent a heartbeat (is FIRSTTOKEN_REDIS_PREFIX right?)")
    for queue, totals in summary(snapshot).items():
        stale = totals["workers"] - totals["alive"]
        text = f"{queue}: {totals['alive']} alive"
        text += f", {stale} stale" if stale else ""
        text += f"; {totals['in_flight']}/{totals['capacity']} in flight" if totals["alive"] else ""
        lines.append(text)
    lines.append(f"(stale: no heartbeat for over {snapshot.lost_s:g}s)")
    return "\n".join(lines)


def _cmd_workers(args: argparse.Namespace) -> int:
    from shared.redis.client import UNREACHABLE

    settings = get_settings()
    try:
        snapshot = asyncio.run(read_workers(settings))
    except UNREACHABLE as exc:
        print(
            f"firsttoken workers: Redis cannot be reached ({type(exc).__name__}: {exc}); "
            "check FIRSTTOKEN_REDIS_URL",
            file=sys.stderr,
        )
        return 1
    print(as_json(snapshot) if args.json else as_table(snapshot))
    return 0


def add_parser(sub: Any) -> None:
    help_ = (
        "List every worker process by queue from its heartbeats: host, pid, in-flight, "
        "capacity, heartbeat age, chats done, engine errors; workers silent for over "
        "FIRSTTOKEN_WORKER_LOST_AFTER_S are marked stale (FIRSTTOKEN_REDIS_URL and _PREFIX)."
    )
    p = sub.add_parser("workers", help=help_, description=help_)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(fn=_cmd_workers)
