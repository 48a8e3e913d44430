"""What the usage report says per group, and ``percentile_cont``'s arithmetic (issue 32).

Shared by the report's two queries (firsttoken/usage/report.py for PostgreSQL,
firsttoken/usage/sqlite.py for SQLite); pure, so that `firsttoken usage` imports no database
library before it needs one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal, Protocol

GroupBy = Literal["tenant", "key", "model", "day", "end_user", "door"]
GROUP_BY: tuple[GroupBy, ...] = ("tenant", "key", "model", "day", "end_user", "door")
TTFT_PERCENTILES = (0.5, 0.95, 0.99)
QUEUE_PERCENTILE = 0.95
ERROR_STATUSES = ("error", "timeout")  # as usage_daily: a cancel is the client's choice
HIT_TIERS = ("exact", "semantic")
LOOKUP_TIERS = ("exact", "semantic", "miss")  # "off" (and NULL, older rows) made no lookup


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


class Row(Protocol):
    """A result row read by column name: asyncpg's Record, SQLAlchemy's RowMapping."""

    def __getitem__(self, name: str, /) -> Any: ...


def to_group(row: Row, ttft: Mapping[float, Any], queue_p95: Any) -> UsageGroup:
    """A group from a row of the totals (as both queries name them) and its percentiles."""
    return UsageGroup(
        group=_key(row["g"]),
        requests=int(row["requests"]),
        errors=int(row["errors"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        cost=_float(row["cost"]),
        unpriced=int(row["unpriced"]),
        exact_hits=int(row["exact_hits"]),
        semantic_hits=int(row["semantic_hits"]),
        lookups=int(row["lookups"]),
        ttft_ms={p: _float(v) for p, v in ttft.items()},
        queue_ms_p95=_float(queue_p95),
    )


def sort_groups(groups: list[UsageGroup]) -> list[UsageGroup]:
    """In order of the grouped value, the group without one last."""
    return sorted(groups, key=lambda g: (g.group is None, g.group or ""))


def _key(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, date) else str(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
