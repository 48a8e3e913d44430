"""`firsttoken usage` over 1M usage rows on PostgreSQL (issue 32: answer in <= 2 s).

Makes a throwaway database, migrates it, fills ``usage_events`` with one generate_series INSERT
(30 days, 50 tenants, 200 keys, 4 models, 5,000 end users, every cache tier, some errors, NULL
TTFTs and unpriced rows), runs the command for every ``--by`` and prints the wall time of each
run (the whole process: start-up, query, output) and of the statement alone, then the command
over an empty window (start-up and connection), then drops the database::

    python bench/usage_report.py [--rows 1000000] [--repeat 3] [--admin-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

import asyncpg

ADMIN_URL = os.environ.get(
    "FIRSTTOKEN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

FILL_SQL = """
INSERT INTO usage_events (
    request_id, tenant_id, key_id, model, route, cached, prompt_tokens, completion_tokens,
    queue_ms, ttft_ms, total_ms, finish_reason, status, created_at, cost, end_user, tags,
    conversation_id, cache_tier, cached_prompt_tokens)
SELECT
    'bench-' || i,
    't' || (i % 50),
    'k' || (i % 200),
    (ARRAY['small', 'large', 'auto', 'other'])[1 + i % 4],
    'default',
    i % 10 < 2,
    50 + i % 900,
    20 + i % 300,
    random() * 20,
    CASE WHEN i % 97 = 0 THEN NULL ELSE 20 + random() * 400 END,
    500 + random() * 3000,
    'stop',
    CASE WHEN i % 97 = 0 THEN 'error' WHEN i % 211 = 0 THEN 'timeout' ELSE 'ok' END,
    timestamptz '2026-11-01 00:00:00+00' + (i % 30) * interval '1 day'
        + (i % 86400) * interval '1 second',
    CASE WHEN random() < 0.25 THEN NULL ELSE (50 + i % 900) * 0.6e-6 + (20 + i % 300) * 2.4e-6 END,
    CASE WHEN i % 3 = 0 THEN NULL ELSE 'u' || (i % 5000) END,
    CASE WHEN i % 5 = 0 THEN '{"team": "search"}'::json ELSE NULL END,
    'c' || (i % 100000),
    (ARRAY['exact', 'semantic', 'miss', 'miss', 'miss', 'off'])[1 + floor(random() * 6)::int],
    CASE WHEN i % 2 = 0 THEN (50 + i % 900) / 2 ELSE NULL END
FROM generate_series(1, $1) AS i
"""


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _query_times(dsn: str, by: str, repeat: int) -> list[float]:
    """The report's statement alone, as the command runs it, in this process (no start-up, no
    connection, no output)."""
    from firsttoken.usage.report import postgres_report

    conn = await asyncpg.connect(dsn, timeout=5)
    times = []
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            await postgres_report(conn, by=by)  # type: ignore[arg-type]
            times.append(time.perf_counter() - start)
    finally:
        await conn.close()
    return times


def _command_times(env: dict[str, str], repeat: int, *args: str) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "firsttoken", "usage", *args],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - start)
    return times


def _runs(times: list[float]) -> str:
    return (
        f"median {statistics.median(times):.2f} s, best {min(times):.2f} s "
        f"(runs: {', '.join(f'{t:.2f}' for t in times)})"
    )


async def _fill(dsn: str, rows: int) -> float:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        start = time.perf_counter()
        await conn.execute(FILL_SQL, rows)
        await conn.execute("ANALYZE usage_events")
        return time.perf_counter() - start
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to insert")
    parser.add_argument("--repeat", type=int, default=3, help="runs per grouping")
    args = parser.parse_args()
    print(f"load average before: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    name = f"ft_bench_usage_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    dsn = f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    url = dsn.replace("postgresql://", "postgresql+asyncpg://")
    env = {**os.environ, "FIRSTTOKEN_DATABASE_URL": url}
    try:
        subprocess.run([sys.executable, "-m", "firsttoken", "migrate"], env=env, check=True)
        print(f"inserted {args.rows:,} rows in {asyncio.run(_fill(dsn, args.rows)):.1f} s")
        for by in ("tenant", "key", "model", "day", "end_user"):
            times = _command_times(env, args.repeat, "--by", by)
            query = asyncio.run(_query_times(dsn, by, args.repeat))
            print(
                f"firsttoken usage --by {by:8}  {_runs(times)}; the query alone: median "
                f"{statistics.median(query):.2f} s, best {min(query):.2f} s"
            )
        # A window after the last row: the created_at index finds nothing, so this is the
        # command's start-up, connection and output.
        empty = _command_times(env, args.repeat, "--since", "2100-01-01")
        print(f"firsttoken usage, empty window  {_runs(empty)}")
        print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
