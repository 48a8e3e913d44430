"""The usage report on SQLite, which has no ``percentile_cont`` (see firsttoken/usage/report.py).

The counts and sums are one GROUP BY; each latency column then takes one window query that
keeps, per group and percentile, the two rows around the rank ``p * (n - 1)``, and
:func:`~firsttoken.usage.report.interpolate` does ``percentile_cont``'s interpolation on them.
SQLite does the sorting; Python sees a handful of rows per group, not the column.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, Integer, and_, cast, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from firsttoken.usage.groups import (
    ERROR_STATUSES,
    LOOKUP_TIERS,
    QUEUE_PERCENTILE,
    TTFT_PERCENTILES,
    GroupBy,
    UsageGroup,
    interpolate,
    sort_groups,
    to_group,
)
from shared.db.models import UsageEvent


def _group_column(by: GroupBy) -> ColumnElement[Any]:
    if by == "day":
        return func.date(UsageEvent.created_at)  # stored in UTC: its UTC day
    columns: dict[str, Any] = {
        "tenant": UsageEvent.tenant_id,
        "key": UsageEvent.key_id,
        "model": UsageEvent.model,
        "end_user": UsageEvent.end_user,
        "door": UsageEvent.door,
    }
    return columns[by]  # type: ignore[no-any-return]


def _window(since: datetime | None, until: datetime | None) -> list[ColumnElement[bool]]:
    where = []
    if since is not None:
        where.append(UsageEvent.created_at >= since)
    if until is not None:
        where.append(UsageEvent.created_at < until)
    return where


def _count_if(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.count().filter(condition)  # FILTER: SQLite >= 3.30


def _totals_columns() -> list[ColumnElement[Any]]:
    return [
        func.count().label("requests"),
        _count_if(UsageEvent.status.in_(ERROR_STATUSES)).label("errors"),
        func.coalesce(func.sum(UsageEvent.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(UsageEvent.completion_tokens), 0).label("completion_tokens"),
        func.sum(UsageEvent.cost).label("cost"),
        _count_if(UsageEvent.cost.is_(None)).label("unpriced"),
        _count_if(UsageEvent.cache_tier == "exact").label("exact_hits"),
        _count_if(UsageEvent.cache_tier == "semantic").label("semantic_hits"),
        _count_if(UsageEvent.cache_tier.in_(LOOKUP_TIERS)).label("lookups"),
    ]


async def _percentiles(
    conn: AsyncConnection,
    group: ColumnElement[Any],
    column: Any,
    percentiles: Sequence[float],
    where: list[ColumnElement[bool]],
) -> dict[Any, dict[float, float | None]]:
    """Per group, ``percentile_cont`` of ``column`` at each of ``percentiles``: the window
    query keeps the two rows around each rank."""
    ordered = (
        select(
            group.label("g"),
            column.label("v"),
            (func.row_number().over(partition_by=group, order_by=column) - 1).label("i"),
            func.count().over(partition_by=group).label("n"),
        )
        .where(column.is_not(None), *where)
        .subquery()
    )
    near = []
    for p in percentiles:
        # CAST truncates, which is floor for these non-negative ranks; p * (n - 1) is the same
        # double multiplication as interpolate's.
        floor = cast(literal(p, Float) * (ordered.c.n - 1), Integer)
        near.append(and_(ordered.c.i >= floor, ordered.c.i <= floor + 1))
    rows = await conn.execute(
        select(ordered.c.g, ordered.c.i, ordered.c.n, ordered.c.v).where(or_(*near))
    )
    ranks: dict[Any, dict[int, float]] = defaultdict(dict)
    sizes: dict[Any, int] = {}
    for g, i, n, v in rows:
        ranks[g][int(i)] = float(v)
        sizes[g] = int(n)
    return {g: {p: interpolate(ranks[g], sizes[g], p) for p in percentiles} for g in sizes}


async def sqlite_report(
    conn: AsyncConnection,
    *,
    by: GroupBy,
    since: datetime | None,
    until: datetime | None,
) -> list[UsageGroup]:
    """The report from SQLite (see :func:`firsttoken.usage.report.usage_report`)."""
    group = _group_column(by)
    where = _window(since, until)
    totals = select(group.label("g"), *_totals_columns()).where(*where).group_by(group)
    rows = (await conn.execute(totals)).mappings().all()
    ttft = await _percentiles(conn, group, UsageEvent.ttft_ms, TTFT_PERCENTILES, where)
    queue = await _percentiles(conn, group, UsageEvent.queue_ms, (QUEUE_PERCENTILE,), where)
    no_values = dict.fromkeys(TTFT_PERCENTILES)
    return sort_groups(
        [
            to_group(
                r,
                ttft.get(r["g"], no_values),
                queue.get(r["g"], {}).get(QUEUE_PERCENTILE),
            )
            for r in rows
        ]
    )
