"""CPU a bulk worker spends per usage row, and how long a row takes to land.

Starts one real bulk worker (`firsttoken worker --queues bulk`) on a fresh PostgreSQL database
(SQLite where the machine has no PostgreSQL) and the machine's Redis, then pushes usage-row
task messages onto its queue at `--rate` per second for `--seconds` through a chat worker's own
batcher (`workers/record.py`, window `--window-ms`), and waits until every row is in the
table. Prints the worker's CPU (all threads, from /proc) per row and the time from the last
push to the last row landing.
At 50 streams of 24-token answers a stack makes ~90 rows/s.

    python scripts/bench_bulk.py --rate 100 --seconds 10 --runs 3 --window-ms 0
    python scripts/bench_bulk.py --rate 100 --seconds 10 --runs 3 --window-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from firsttoken.bench.stack import (  # noqa: E402
    DEFAULT_PG_ADMIN_URL,
    _pg_admin,
    _pg_ok,
    cpu_seconds,
)
from firsttoken.procs import Child  # noqa: E402
from shared.tasks import UsageRecord  # noqa: E402


def _usage() -> UsageRecord:
    now = time.time()
    return UsageRecord(
        request_id=uuid.uuid4().hex,
        tenant_id="bench",
        key_id="bench",
        model="sim",
        route="default",
        cached=False,
        prompt_tokens=12,
        completion_tokens=24,
        queue_ms=1.0,
        ttft_ms=150.0,
        total_ms=500.0,
        finish_reason="length",
        status="ok",
        created_at=now,
    )


async def _push(args: argparse.Namespace, queue_key: str, n: int) -> None:
    """`n` rows at `--rate`, through the chat worker's own batcher (workers/record.py)."""
    import redis.asyncio as aioredis

    from workers.record import UsageBatcher

    r = aioredis.Redis.from_url(args.redis_url)
    batcher = UsageBatcher(r, queue_key, "bench", args.window_ms / 1000.0)
    t0 = time.monotonic()
    for i in range(n):  # evenly spaced, like a steady stream of finished chats
        delay = t0 + i / args.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        batcher.add(_usage())
    await batcher.close()
    await r.aclose()


async def _count_rows(database_url: str) -> int:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text("SELECT count(*) FROM usage_events"))).scalar_one())
    finally:
        await engine.dispose()


def _one_run(args: argparse.Namespace, worker: Child, database_url: str, queue_key: str) -> dict:
    before = asyncio.run(_count_rows(database_url))
    n = int(args.rate * args.seconds)
    cpu0 = cpu_seconds(worker.pid)
    t0 = time.monotonic()
    asyncio.run(_push(args, queue_key, n))
    pushed = time.monotonic()
    while asyncio.run(_count_rows(database_url)) < before + n:
        if time.monotonic() - pushed > 120:
            raise SystemExit("rows did not land within 120 s; see the worker log")
        time.sleep(0.05)
    landed = time.monotonic()
    cpu = cpu_seconds(worker.pid) - cpu0
    return {
        "rows": n,
        "cpu_ms_per_row": cpu * 1000 / n,
        "cpu_share": cpu / (landed - t0),
        "drain_ms": (landed - pushed) * 1000,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=100.0, help="rows pushed per second (100)")
    p.add_argument("--seconds", type=float, default=10.0, help="per run (default: 10)")
    p.add_argument("--runs", type=int, default=3, help="repeats (default: 3)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--pg-admin-url", default=DEFAULT_PG_ADMIN_URL)
    p.add_argument("--queue", default="bulk")
    p.add_argument(
        "--window-ms",
        type=float,
        default=50.0,
        help="the chat worker's batching window (FIRSTTOKEN_USAGE_BATCH_MS; 0: a task per row)",
    )
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ft-bulk-"))
    prefix = f"ftbulk{uuid.uuid4().hex[:8]}"
    dbname = f"ft_bulk_{uuid.uuid4().hex[:10]}"
    use_pg = _pg_ok(args.pg_admin_url)
    if use_pg:
        _pg_admin(args.pg_admin_url, f'CREATE DATABASE "{dbname}"')
        base = args.pg_admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
        database_url = f"{base}/{dbname}"
    else:
        database_url = f"sqlite+aiosqlite:///{work / 'db.sqlite'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env.update(
        FIRSTTOKEN_REDIS_URL=args.redis_url,
        FIRSTTOKEN_REDIS_PREFIX=prefix,
        FIRSTTOKEN_DATABASE_URL=database_url,
        FIRSTTOKEN_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    os.environ.update({k: v for k, v in env.items() if k.startswith("FIRSTTOKEN_")})
    from shared.db.migrate import upgrade
    from shared.keys import Keys

    upgrade(database_url)
    queue_key = Keys(prefix).queue_list(args.queue)
    worker = Child(
        [sys.executable, "-m", "firsttoken", "worker", "--queues", args.queue],
        env,
        work / "worker.log",
    )
    results = []
    try:
        time.sleep(3)  # the worker's start-up
        warm = argparse.Namespace(**{**vars(args), "seconds": 1.0})
        _one_run(warm, worker, database_url, queue_key)
        for run in range(1, args.runs + 1):
            row = _one_run(args, worker, database_url, queue_key)
            results.append(row)
            print(
                f"run {run}: {row['rows']} rows at {args.rate:g}/s, window {args.window_ms:g} ms: "
                f"{row['cpu_ms_per_row']:.2f} ms CPU per row ({row['cpu_share']:.0%} of a core), "
                f"last row landed {row['drain_ms']:.0f} ms after the last push",
                flush=True,
            )
    finally:
        worker.stop()
        import redis

        r = redis.Redis.from_url(args.redis_url)
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            r.delete(*keys)
        if use_pg:
            _pg_admin(args.pg_admin_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    print(
        f"median over {len(results)} runs: "
        f"{statistics.median(r['cpu_ms_per_row'] for r in results):.2f} ms CPU per row, "
        f"drain {statistics.median(r['drain_ms'] for r in results):.0f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
