"""Usage per tenant, key, model, day or end user, read from ``usage_events`` (issue 32).

Per group: requests, errors, prompt and completion tokens, cost, cache hit rate by tier, TTFT
p50/p95/p99 and queue wait p95. The same numbers from both databases:

- PostgreSQL computes everything in one statement, the percentiles with ``percentile_cont``
  (continuous: linear interpolation between the two nearest ranks) over each group's values
  (see :func:`postgres_sql` for why not a plain GROUP BY). It runs on a bare asyncpg connection
  (:func:`postgres_report`), so that `firsttoken usage` starts without SQLAlchemy.
- SQLite has no ``percentile_cont``. The counts and sums are the same GROUP BY; each latency
  column then takes one window query (``ROW_NUMBER`` and ``COUNT`` over the group, ordered by
  the value) that returns, per group and percentile, only the two rows around the rank
  ``p * (n - 1)``, and :func:`interpolate` does ``percentile_cont``'s interpolation on them in
  Python (``firsttoken/usage/sqlite.py``).

Percentiles skip NULLs (a chat that failed before its first token has no TTFT), as
``percentile_cont`` does; a group with no values has None. Days are UTC, as in ``usage_daily``.
The queries only read. The groups and the interpolation are in ``firsttoken/usage/groups.py``.
This module imports neither SQLAlchemy nor asyncpg until it runs: the command's start-up is part
of its time budget (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from firsttoken.usage.groups import (
    ERROR_STATUSES,
    HIT_TIERS,
    LOOKUP_TIERS,
    QUEUE_PERCENTILE,
    TTFT_PERCENTILES,
    GroupBy,
    UsageGroup,
    sort_groups,
    to_group,
)

if TYPE_CHECKING:
    import asyncpg
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

# For the report's own transaction only (SET LOCAL):
PG_SETTINGS = {
    # The per-group arrays and their sorts stay in memory instead of spilling to disk at
    # PostgreSQL's default of 4MB.
    "work_mem": "128MB",
    # The statement is written for a hash aggregate. Without statistics on the day expression
    # the planner guesses tens of thousands of days, prices each group's array_agg state and
    # picks a sort of the whole window by group instead, the slow plan this statement avoids
    # (docs/benchmarks.md). Only a plan's Sort nodes are discouraged; percentile_cont's own
    # sort of each group's values is not one.
    "enable_sort": "off",
    # A larger table's cost crosses jit_above_cost; compiling this aggregate's expressions
    # measured slower than interpreting them.
    "jit": "off",
}

# Each grouping's SQL expression on PostgreSQL; the day is UTC's, as usage_daily's.
PG_GROUP = {
    "tenant": "tenant_id",
    "key": "key_id",
    "model": "model",
    "day": "(created_at AT TIME ZONE 'UTC')::date",
    "end_user": "end_user",
    "door": "door",
}


def _sql_list(values: Iterable[str]) -> str:
    # The module's own constants, never user input.
    return ", ".join(f"'{v}'" for v in values)


def postgres_sql(
    by: GroupBy, since: datetime | None, until: datetime | None
) -> tuple[str, list[datetime]]:
    """The statement for PostgreSQL and its arguments ($1, $2): per group, the totals, TTFT
    percentiles and queue p95.

    The plain ``percentile_cont ... GROUP BY`` sorts the whole window by the group first (a
    GroupAggregate: ordered-set aggregates cannot be hashed), and then each group again per
    percentile: 1.5-3 s over 1M rows here. Collecting each group's values with ``array_agg``
    in a hash aggregate and running ``percentile_cont`` over each group's array sorts only
    within groups: about half the time (docs/benchmarks.md). It holds the window's TTFT and
    queue values in memory (16 bytes a row), hence :data:`PG_SETTINGS`. The arrays are
    unnested in a SELECT list, not in FROM, which would first copy every value into a
    tuplestore; they are sorted here, never sent.
    """
    where, args = [], []
    for op, bound in ((">=", since), ("<", until)):
        if bound is not None:
            args.append(bound)
            where.append(f"created_at {op} ${len(args)}")
    tiers = ", ".join(f"count(*) FILTER (WHERE cache_tier = '{t}') AS {t}" for t in LOOKUP_TIERS)
    sql = f"""
SELECT g, requests, errors, prompt_tokens, completion_tokens, cost, unpriced,
    {" + ".join(LOOKUP_TIERS)} AS lookups, {", ".join(f"{t} AS {t}_hits" for t in HIT_TIERS)},
    (SELECT percentile_cont(ARRAY[{", ".join(map(str, TTFT_PERCENTILES))}]::float8[])
        WITHIN GROUP (ORDER BY v) FROM (SELECT unnest(ttft_values) AS v) AS t) AS ttft,
    (SELECT percentile_cont({QUEUE_PERCENTILE}::float8)
        WITHIN GROUP (ORDER BY v) FROM (SELECT unnest(queue_values) AS v) AS q) AS queue
FROM (
    SELECT {PG_GROUP[by]} AS g,
        count(*) AS requests,
        count(*) FILTER (WHERE status IN ({_sql_list(ERROR_STATUSES)})) AS errors,
        coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
        coalesce(sum(completion_tokens), 0) AS completion_tokens,
        sum(cost) AS cost,
        count(*) FILTER (WHERE cost IS NULL) AS unpriced,
        {tiers},
        array_agg(ttft_ms) FILTER (WHERE ttft_ms IS NOT NULL) AS ttft_values,
        array_agg(queue_ms) FILTER (WHERE queue_ms IS NOT NULL) AS queue_values
    FROM usage_events
    {"WHERE " + " AND ".join(where) if where else ""}
    GROUP BY 1
) AS per_group"""
    return sql, args


async def postgres_report(
    conn: asyncpg.Connection,
    *,
    by: GroupBy = "tenant",
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageGroup]:
    """The report from PostgreSQL over an asyncpg connection (see :func:`usage_report`)."""
    sql, args = postgres_sql(by, since, until)
    # SET LOCAL ends with this transaction, or with the caller's when this is a savepoint in it.
    async with conn.transaction():
        for name, value in PG_SETTINGS.items():
            await conn.execute(f"SET LOCAL {name} = '{value}'")
        rows = await conn.fetch(sql, *args)
    groups = []
    for r in rows:
        ttft = r["ttft"] or [None] * len(TTFT_PERCENTILES)
        queue = r["queue"]
        groups.append(to_group(r, dict(zip(TTFT_PERCENTILES, ttft, strict=True)), queue))
    return sort_groups(groups)


async def usage_report(
    conn: AsyncConnection | AsyncSession,
    *,
    by: GroupBy = "tenant",
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageGroup]:
    """The report's groups, in order of the grouped value (rows without one last);
    ``since`` inclusive, ``until`` exclusive (aware datetimes, compared in UTC). Takes any
    SQLAlchemy async connection or session; on PostgreSQL (asyncpg, the project's driver) it
    runs :func:`postgres_report` on the driver's connection, the command's own path."""
    from sqlalchemy.ext.asyncio import AsyncSession

    connection = await conn.connection() if isinstance(conn, AsyncSession) else conn
    if connection.dialect.name == "postgresql":
        raw = await connection.get_raw_connection()
        return await postgres_report(raw.driver_connection, by=by, since=since, until=until)
    from firsttoken.usage.sqlite import sqlite_report

    return await sqlite_report(connection, by=by, since=since, until=until)
