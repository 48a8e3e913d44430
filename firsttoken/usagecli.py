"""`firsttoken usage`: requests, errors, tokens, cost, cache hit rates and latency percentiles
per tenant, key, model, day or end user, from ``usage_events`` (firsttoken/usage/report.py),
as a table, CSV or JSON; ``--plot FILE`` also draws TTFT percentiles and the cache hit rate
per day (matplotlib, the ``bench`` extra, imported only then).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from firsttoken.usage.groups import GROUP_BY, GroupBy, UsageGroup
from shared.env import ENV_PREFIX

# The database clients are imported inside the command: `firsttoken --help` should not pay for
# them, and the report on PostgreSQL pays only for asyncpg (not SQLAlchemy, not the settings):
# start-up counts in the command's time (docs/benchmarks.md).

INSTALL_MATPLOTLIB = "pip install 'firsttoken[bench]' (or: pip install 'matplotlib>=3.7')"
# shared.db.session.PG_CONNECT_TIMEOUT_S, spelled out: importing it (SQLAlchemy) would slow the
# command's start (tests/unit/firsttoken/test_usagecli.py checks they agree).
PG_CONNECT_TIMEOUT_S = 10.0


class UsageError(Exception):
    """What the command prints before exiting 1: the database, not the arguments, failed."""


def parse_when(text: str, *, end_of_day: bool = False) -> datetime:
    """A UTC time from YYYY-MM-DD (its midnight; with `end_of_day` the next midnight, so
    `--until 2026-12-03` includes that day) or an ISO 8601 time (UTC unless it says)."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return start + timedelta(days=1) if end_of_day else start
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date: use YYYY-MM-DD (UTC days) or an ISO 8601 time such as "
            "2026-12-01T13:30 or 2026-12-01T13:30+01:00"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _until(text: str) -> datetime:
    return parse_when(text, end_of_day=True)


# --- output ---------------------------------------------------------------------------------

COLUMNS = (
    ("group", "{}"),
    ("requests", "{:d}"),
    ("errors", "{:d}"),
    ("prompt_tokens", "{:d}"),
    ("completion_tokens", "{:d}"),
    ("cost", "{:.6f}"),
    ("unpriced", "{:d}"),
    ("cache_lookups", "{:d}"),
    ("exact_hit_rate", "{:.1%}"),
    ("semantic_hit_rate", "{:.1%}"),
    ("hit_rate", "{:.1%}"),
    ("ttft_p50_ms", "{:.1f}"),
    ("ttft_p95_ms", "{:.1f}"),
    ("ttft_p99_ms", "{:.1f}"),
    ("queue_p95_ms", "{:.1f}"),
)
# Table headers: short enough for a terminal.
HEADERS = {
    "group": "",
    "prompt_tokens": "prompt_tok",
    "completion_tokens": "compl_tok",
    "cache_lookups": "lookups",
    "exact_hit_rate": "exact",
    "semantic_hit_rate": "semantic",
    "hit_rate": "hit",
    "ttft_p50_ms": "ttft_p50",
    "ttft_p95_ms": "ttft_p95",
    "ttft_p99_ms": "ttft_p99",
    "queue_p95_ms": "queue_p95",
}


def render(groups: list[UsageGroup], fmt: str, by: str, names: dict[str, str] | None = None) -> str:
    """The report as `table`, `csv` or `json` text (rows in the groups' order). `names`: the
    tenants' names by id (`--by tenant`): people read names; JSON has the id beside it."""
    rows = [g.as_dict() for g in groups]
    if names is not None:
        for r in rows:
            r["id"] = r["group"]
            r["group"] = names.get(r["group"], r["group"]) if r["group"] is not None else None
    if fmt == "json":
        if names is not None:
            return (
                json.dumps(
                    [{by: r.pop("group"), f"{by}_id": r.pop("id"), **r} for r in rows], indent=2
                )
                + "\n"
            )
        return json.dumps([{by: r.pop("group"), **r} for r in rows], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([by if name == "group" else name for name, _ in COLUMNS])
        for r in rows:
            writer.writerow(["" if r[name] is None else r[name] for name, _ in COLUMNS])
        return out.getvalue()
    return _table(rows, by)


def _table(rows: list[dict[str, Any]], by: str) -> str:
    header = [HEADERS.get(name, name) or by for name, _ in COLUMNS]
    body = [
        [
            ("(none)" if name == "group" else "-") if r[name] is None else spec.format(r[name])
            for name, spec in COLUMNS
        ]
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body, strict=True)]
    lines = []
    for cells in (header, *body):
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        lines.append("  ".join((first, *rest)).rstrip())
    if not rows:
        lines.append("(no usage in this window)")
    return "\n".join(lines) + "\n"


def plot(days: list[UsageGroup], path: Path) -> None:
    """One PNG: TTFT p50/p95/p99 per day (left axis) and the cache hit rate (right axis)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_MATPLOTLIB}"
        ) from None
    matplotlib.use("Agg")  # files only: no display needed (or wanted) on a server
    import matplotlib.dates
    import matplotlib.pyplot as plt

    # Any: matplotlib.dates is partly unannotated, and mypy without matplotlib sees nothing.
    mdates: Any = matplotlib.dates

    dated = [g for g in days if g.group is not None]
    days_utc = [date.fromisoformat(g.group) for g in dated if g.group is not None]
    x = mdates.date2num(days_utc)
    fig, ttft_axis = plt.subplots(figsize=(10, 5), dpi=100)
    try:
        for p, color in ((0.5, "tab:blue"), (0.95, "tab:orange"), (0.99, "tab:red")):
            values = [g.ttft_ms.get(p) for g in dated]
            ttft_axis.plot(
                x,
                [float("nan") if v is None else v for v in values],
                color=color,
                marker="o",
                label=f"TTFT p{round(p * 100)}",
            )
        ttft_axis.xaxis_date()
        ttft_axis.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
        if len(x) <= 31:  # one tick per day while they fit; matplotlib's choice beyond
            ttft_axis.set_xticks(x)
        ttft_axis.set_ylim(bottom=0)
        ttft_axis.set_ylabel("time to first token (ms)")
        ttft_axis.set_xlabel("day (UTC)")
        rate_axis = ttft_axis.twinx()
        rates = [g.hit_rate() for g in dated]
        rate_axis.plot(
            x,
            [float("nan") if r is None else r * 100 for r in rates],
            color="tab:green",
            linestyle="--",
            marker="s",
            label="cache hit rate",
        )
        rate_axis.set_ylabel("cache hit rate (% of lookups)")
        rate_axis.set_ylim(0, 100)
        lines = ttft_axis.get_legend_handles_labels()
        more = rate_axis.get_legend_handles_labels()
        ttft_axis.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
        ttft_axis.set_title("firsttoken: TTFT percentiles and cache hit rate per day")
        fig.autofmt_xdate()
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as exc:
            raise UsageError(f"cannot write the plot to {path}: {exc}") from exc
    finally:
        plt.close(fig)


# --- the command ----------------------------------------------------------------------------


def _shown(url: str) -> str:
    from sqlalchemy import make_url  # only to print an error

    return make_url(url).render_as_string(hide_password=True)


def database_url() -> str:
    """FIRSTTOKEN_DATABASE_URL, as the settings read it (any case), else the settings' value.

    The settings object (pydantic) is a tenth of a second to import and validate, on a command
    with a time budget that needs one of its fields."""
    wanted = f"{ENV_PREFIX}DATABASE_URL"
    for name, value in os.environ.items():
        if name.upper() == wanted:
            return value
    from shared.settings import get_settings

    return get_settings().database_url


def asyncpg_dsn(database_url: str) -> str | None:
    """The asyncpg DSN for a plain ``postgresql+asyncpg://`` URL, else None: other databases,
    and URLs with options (SQLAlchemy's dialect reads those), go through an engine."""
    parts = urlsplit(database_url)
    if parts.scheme != "postgresql+asyncpg" or parts.query:
        return None
    return urlunsplit(parts._replace(scheme="postgresql"))


Report = Callable[[GroupBy], Awaitable[list[UsageGroup]]]


async def _with_days(
    report: Report, by: GroupBy, with_days: bool
) -> tuple[list[UsageGroup], list[UsageGroup] | None]:
    groups = await report(by)
    if not with_days:
        return groups, None
    return groups, groups if by == "day" else await report("day")


async def _fetch_postgres(
    dsn: str, by: GroupBy, since: datetime | None, until: datetime | None, with_days: bool
) -> tuple[list[UsageGroup], list[UsageGroup] | None]:
    import asyncpg

    from firsttoken.usage.report import postgres_report

    conn = await asyncpg.connect(dsn, timeout=PG_CONNECT_TIMEOUT_S)
    try:
        return await _with_days(
            lambda b: postgres_report(conn, by=b, since=since, until=until), by, with_days
        )
    finally:
        await conn.close()


async def _fetch_engine(
    database_url: str, by: GroupBy, since: datetime | None, until: datetime | None, with_days: bool
) -> tuple[list[UsageGroup], list[UsageGroup] | None]:
    from firsttoken.usage.report import usage_report
    from shared.db.session import make_engine

    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            return await _with_days(
                lambda b: usage_report(conn, by=b, since=since, until=until), by, with_days
            )
    finally:
        await engine.dispose()


async def fetch(
    database_url: str,
    by: GroupBy,
    since: datetime | None,
    until: datetime | None,
    *,
    with_days: bool = False,
) -> tuple[list[UsageGroup], list[UsageGroup] | None]:
    """The report grouped `by`, and with `with_days` also by day (for the plot); UsageError
    saying what to do when the database cannot be read."""
    dsn = asyncpg_dsn(database_url)
    try:
        if dsn is not None:
            return await _fetch_postgres(dsn, by, since, until, with_days)
        return await _fetch_engine(database_url, by, since, until, with_days)
    except Exception as exc:
        error = _usage_error(exc, database_url)
        if error is None:
            raise
        raise error from exc


def _usage_error(exc: Exception, database_url: str) -> UsageError | None:
    """What to say when the database failed (`exc`); None for anything else."""
    import asyncpg
    from sqlalchemy.exc import DBAPIError

    from shared.db.errors import is_retryable

    where = f"the database at {_shown(database_url)}"
    text = str(getattr(exc, "orig", None) or exc)
    if "no such table" in text or ("usage_events" in text and "does not exist" in text):
        return UsageError(f"{where} has no usage_events table: run `firsttoken migrate`")
    if is_retryable(exc) or isinstance(exc, DBAPIError | asyncpg.PostgresError):
        return UsageError(
            f"cannot read usage from {where}: {type(exc).__name__}: {text.strip()[:300]}"
        )
    return None


def check_database_exists(database_url: str) -> None:
    """A SQLite file that is not there is a mistake to report, not a database to create (the
    engine would create an empty one)."""
    if not database_url.startswith("sqlite"):
        return
    from sqlalchemy import make_url

    parsed = make_url(database_url)
    name = parsed.database
    if not name or name == ":memory:":
        return
    if name.startswith("file:") or Path(name).expanduser().exists():
        return
    raise UsageError(
        f"no database at {name} (FIRSTTOKEN_DATABASE_URL={_shown(database_url)}); "
        "`firsttoken up` or `firsttoken migrate` creates it"
    )


async def tenant_names(database_url: str) -> dict[str, str]:
    """Every tenant's name by id (a small table: one read)."""
    dsn = asyncpg_dsn(database_url)
    if dsn is not None:
        import asyncpg

        conn = await asyncpg.connect(dsn, timeout=PG_CONNECT_TIMEOUT_S)
        try:
            return {str(r["id"]): str(r["name"]) for r in await conn.fetch(TENANTS_SQL)}
        finally:
            await conn.close()
    from sqlalchemy import text

    from shared.db.session import make_engine

    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            return {str(i): str(n) for i, n in (await conn.execute(text(TENANTS_SQL))).all()}
    finally:
        await engine.dispose()


TENANTS_SQL = "SELECT id, name FROM tenants"


def _cmd_usage(args: argparse.Namespace) -> int:
    if args.since is not None and args.until is not None and args.since >= args.until:
        print("firsttoken usage: --since must be before --until", file=sys.stderr)
        return 2
    url = database_url()
    try:
        check_database_exists(url)
        groups, days = asyncio.run(
            fetch(url, args.by, args.since, args.until, with_days=args.plot is not None)
        )
        names = asyncio.run(tenant_names(url)) if args.by == "tenant" else None
        sys.stdout.write(render(groups, args.format, args.by, names))
        if args.plot is not None:
            assert days is not None
            plot(days, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    except UsageError as exc:
        print(f"firsttoken usage: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `usage` to the `firsttoken` command."""
    description = (
        "Usage from the database (FIRSTTOKEN_DATABASE_URL): per group, requests, errors, "
        "prompt/completion tokens, cost (models with prices), cache hit rate by tier, TTFT "
        "p50/p95/p99 and queue wait p95. Times are UTC."
    )
    p = sub.add_parser(
        "usage", help="Report usage, cost and latency per group.", description=description
    )
    p.add_argument(
        "--since",
        type=parse_when,
        default=None,
        metavar="DATE",
        help="from this UTC day (YYYY-MM-DD) or ISO 8601 time, inclusive (default: the first row)",
    )
    p.add_argument(
        "--until",
        type=_until,
        default=None,
        metavar="DATE",
        help="up to the end of this UTC day (YYYY-MM-DD), or before this ISO 8601 time "
        "(default: the last row)",
    )
    p.add_argument(
        "--by",
        choices=GROUP_BY,
        default="tenant",
        help="one row per tenant (default), API key, model, UTC day or end user (the chat "
        "frame's `user`; rows without one as '(none)')",
    )
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table (default, for people), csv or json (for tools; rates as fractions)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a PNG of TTFT p50/p95/p99 and the cache hit rate per day to FILE "
        f"(needs matplotlib: {INSTALL_MATPLOTLIB})",
    )
    p.set_defaults(fn=_cmd_usage)
