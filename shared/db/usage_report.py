"""Usage per tenant, key, model, day or end user, read from ``usage_events`` (issue 32).

Per group: requests, errors, prompt and completion tokens, cost, cache hit rate by tier, TTFT
p50/p95/p99 and queue wait p95. The same numbers from both databases:

- PostgreSQL computes everything in one statement, the percentiles with ``percentile_cont``
  (continuous: linear interpolation between the two nearest ranks) over each group's values
  (see :func:`postgres_statement` for why not a plain GROUP BY).
- SQLite has no ``percentile_cont``. The counts and sums are the same GROUP BY; each latency
  column then takes one window query (``ROW_NUMBER`` and ``COUNT`` over the group, ordered by
  the value) that returns, per group and percentile, only the two rows around the rank
  ``p * (n - 1)``, and :func:`interpolate` does ``percentile_cont``'s interpolation on them in
  Python. SQLite does the sorting; Python sees a handful of rows per group, not the column.

Percentiles skip NULLs (a chat that failed before its first token has no TTFT), as
``percentile_cont`` does; a group with no values has None. Days are UTC, as in ``usage_daily``.
The queries only read; :func:`usage_report` takes any async connection or session.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Date,
    Float,
    Integer,
    and_,
    cast,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from shared.db.models import UsageEvent

GroupBy = Literal["tenant", "key", "model", "day", "end_user"]
GROUP_BY: tuple[GroupBy, ...] = ("tenant", "key", "model", "day", "end_user")
TTFT_PERCENTILES = (0.5, 0.95, 0.99)
QUEUE_PERCENTILE = 0.95
ERROR_STATUSES = ("error", "timeout")  # as usage_daily: a cancel is the client's choice
HIT_TIERS = ("exact", "semantic")
LOOKUP_TIERS = ("exact", "semantic", "miss")  # "off" (and NULL, older rows) made no lookup
# For the report's own transaction only (SET LOCAL): the per-group arrays and their sorts stay
# in memory instead of spilling to disk at PostgreSQL's default of 4MB.
PG_WORK_MEM = "128MB"


@dataclass(frozen=True, slots=True)
class UsageGroup:
    """One group's numbers; ``group`` is None for rows without the grouped value (no end
    user)."""

    group: str | None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None  # of the priced requests; None when none was priced
    unpriced: int  # requests whose model has no prices (cost NULL)
    exact_hits: int
    semantic_hits: int
    lookups: int  # requests that looked in the cache: exact, semantic or miss
    ttft_ms: dict[float, float | None] = field(default_factory=dict)  # percentile -> ms
    queue_ms_p95: float | None = None

    def hit_rate(self, tier: str | None = None) -> float | None:
        """Share of cache lookups answered by ``tier`` (None: by either tier)."""
        if not self.lookups:
            return None
        hits = {"exact": self.exact_hits, "semantic": self.semantic_hits}
        return (hits[tier] if tier else self.exact_hits + self.semantic_hits) / self.lookups

    def as_dict(self) -> dict[str, Any]:
        """Flat, in the report's column order (the CLI's json and csv)."""
        return {
            "group": self.group,
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "unpriced": self.unpriced,
            "cache_lookups": self.lookups,
            "exact_hit_rate": self.hit_rate("exact"),
            "semantic_hit_rate": self.hit_rate("semantic"),
            "hit_rate": self.hit_rate(),
            **{f"ttft_p{round(p * 100)}_ms": v for p, v in self.ttft_ms.items()},
            "queue_p95_ms": self.queue_ms_p95,
        }


def interpolate(ranks: dict[int, float], n: int, p: float) -> float | None:
    """``percentile_cont(p)`` of ``n`` sorted values, given the values at ranks (0-based)
    ``floor(p * (n - 1))`` and the one after it; None for no values."""
    if n <= 0:
        return None
    pos = p * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    low, high = ranks[lo], ranks[hi]
    return low + (pos - lo) * (high - low)


def percentile_cont(values: Iterable[float], p: float) -> float | None:
    """``percentile_cont(p)`` of ``values`` (the reference the queries are tested against)."""
    ordered = sorted(values)
    return interpolate(dict(enumerate(ordered)), len(ordered), p)


def _group_column(by: GroupBy, dialect: str) -> ColumnElement[Any]:
    if by == "day":
        if dialect == "postgresql":
            # A literal, not a bound parameter: SELECT and GROUP BY must be the same expression,
            # and two parameters ($1, $2) would make them differ for PostgreSQL.
            return cast(func.timezone(literal_column("'UTC'"), UsageEvent.created_at), Date)
        return func.date(UsageEvent.created_at)
    columns: dict[str, Any] = {
        "tenant": UsageEvent.tenant_id,
        "key": UsageEvent.key_id,
        "model": UsageEvent.model,
        "end_user": UsageEvent.end_user,
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
    # FILTER (SQLite >= 3.30): a fifth cheaper than SUM(CASE ...) on PostgreSQL over 1M rows.
    return func.count().filter(condition)


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


def postgres_statement(group: ColumnElement[Any], where: list[ColumnElement[bool]]) -> Any:
    """Per group: the totals, TTFT percentiles and queue p95 in one statement.

    The plain ``percentile_cont ... GROUP BY`` sorts the whole window by the group first (a
    GroupAggregate: ordered-set aggregates cannot be hashed), and then each group again per
    percentile: 1.5-3 s over 1M rows here. Collecting each group's values with ``array_agg``
    in a hash aggregate and running ``percentile_cont`` over each group's array sorts only
    within groups: about half the time (docs/benchmarks.md). It holds the window's TTFT and
    queue values in memory (16 bytes a row), hence the session's larger ``work_mem``.
    """
    ttft, queue = UsageEvent.ttft_ms, UsageEvent.queue_ms
    inner = (
        select(
            group.label("g"),
            *_totals_columns(),
            func.array_agg(ttft).filter(ttft.is_not(None)).label("ttft_values"),
            func.array_agg(queue).filter(queue.is_not(None)).label("queue_values"),
        )
        .where(*where)
        .group_by(group)
        .subquery()
    )

    def percentiles(values: Any, fractions: Sequence[float]) -> Any:
        value = func.unnest(values).column_valued("v")
        at = postgresql.array([literal(p, Float) for p in fractions])
        return select(func.percentile_cont(at).within_group(value)).scalar_subquery()

    arrays = ("ttft_values", "queue_values")  # sorted here, never sent: 16 bytes a row
    return select(
        *(c for c in inner.c if c.name not in arrays),
        percentiles(inner.c.ttft_values, TTFT_PERCENTILES).label("ttft"),
        percentiles(inner.c.queue_values, (QUEUE_PERCENTILE,)).label("queue"),
    )


async def _postgres_report(
    conn: AsyncConnection | AsyncSession,
    group: ColumnElement[Any],
    where: list[ColumnElement[bool]],
) -> list[tuple[RowMapping, dict[float, Any], Any]]:
    """Per group: the totals, TTFT percentiles and queue p95 (see :func:`postgres_statement`)."""
    await conn.execute(text(f"SET LOCAL work_mem = '{PG_WORK_MEM}'"))
    rows = (await conn.execute(postgres_statement(group, where))).mappings().all()
    out = []
    for r in rows:
        ttft_at = r["ttft"] or [None] * len(TTFT_PERCENTILES)
        queue_at = r["queue"] or [None]
        out.append((r, dict(zip(TTFT_PERCENTILES, ttft_at, strict=True)), queue_at[0]))
    return out


async def _sqlite_percentiles(
    conn: AsyncConnection | AsyncSession,
    group: ColumnElement[Any],
    column: Any,
    percentiles: Sequence[float],
    where: list[ColumnElement[bool]],
) -> dict[Any, dict[float, float | None]]:
    """Per group, ``percentile_cont`` of ``column`` at each of ``percentiles`` (see the
    module's docstring): the window query keeps the two rows around each rank."""
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


def _key(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, date) else str(value)


async def usage_report(
    conn: AsyncConnection | AsyncSession,
    *,
    by: GroupBy = "tenant",
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageGroup]:
    """The report's groups, in order of the grouped value (rows without one last);
    ``since`` inclusive, ``until`` exclusive (aware datetimes, compared in UTC)."""
    dialect = conn.get_bind().dialect.name if isinstance(conn, AsyncSession) else conn.dialect.name
    group = _group_column(by, dialect)
    where = _window(since, until)
    if dialect == "postgresql":
        found = await _postgres_report(conn, group, where)
        rows = [r for r, _, _ in found]
        ttft = {r["g"]: at for r, at, _ in found}
        queue = {r["g"]: p95 for r, _, p95 in found}
    else:
        totals = select(group.label("g"), *_totals_columns()).where(*where).group_by(group)
        rows = list((await conn.execute(totals)).mappings().all())
        ttft = await _sqlite_percentiles(conn, group, UsageEvent.ttft_ms, TTFT_PERCENTILES, where)
        by_queue = await _sqlite_percentiles(
            conn, group, UsageEvent.queue_ms, (QUEUE_PERCENTILE,), where
        )
        queue = {g: v[QUEUE_PERCENTILE] for g, v in by_queue.items()}
    no_values = dict.fromkeys(TTFT_PERCENTILES)
    groups = [
        UsageGroup(
            group=_key(r["g"]),
            requests=int(r["requests"]),
            errors=int(r["errors"]),
            prompt_tokens=int(r["prompt_tokens"]),
            completion_tokens=int(r["completion_tokens"]),
            cost=None if r["cost"] is None else float(r["cost"]),
            unpriced=int(r["unpriced"]),
            exact_hits=int(r["exact_hits"]),
            semantic_hits=int(r["semantic_hits"]),
            lookups=int(r["lookups"]),
            ttft_ms=_floats(ttft.get(r["g"], no_values)),
            queue_ms_p95=_float(queue.get(r["g"])),
        )
        for r in rows
    ]
    return sorted(groups, key=lambda g: (g.group is None, g.group or ""))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _floats(values: dict[float, Any]) -> dict[float, float | None]:
    return {p: _float(v) for p, v in values.items()}
