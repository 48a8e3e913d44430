"""`firsttoken usage`: the report's numbers on SQLite and PostgreSQL against rows with known
percentiles, and the command's formats, plot and errors."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from firsttoken.migrate import upgrade
from firsttoken.usage.groups import GROUP_BY, GroupBy, UsageGroup, percentile_cont
from firsttoken.usage.report import usage_report
from shared.db.session import make_engine, make_sessionmaker
from shared.db.writes import insert_usage_rows
from shared.tasks import UsageRecord
from tests.support import child_env, postgres_available, postgres_database, python_cmd

pytestmark = pytest.mark.integration

DAY1 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DAY2 = DAY1 + 86_400


def _tier(i: int) -> str:
    return "exact" if i <= 10 else "semantic" if i <= 15 else "miss" if i <= 90 else "off"


def rows() -> list[UsageRecord]:
    """Tenant a: 100 priced chats on day 1 with TTFT 1..100 ms and queue 2..200 ms; tenant b:
    5 unpriced chats on day 2, one of which timed out before its first token."""
    a = [
        UsageRecord(
            request_id=f"a{i}",
            tenant_id="t-a",
            key_id="k1",
            model="m1",
            prompt_tokens=10,
            completion_tokens=5,
            queue_ms=2.0 * i,
            ttft_ms=float(i),
            total_ms=float(i) + 100,
            finish_reason="stop",
            status="error" if i % 25 == 0 else "ok",
            created_at=DAY1 + i,
            cost=0.001,
            end_user="u1" if i % 2 else None,
            cache_tier=_tier(i),
        )
        for i in range(1, 101)
    ]
    b = [
        UsageRecord(
            request_id=f"b{i}",
            tenant_id="t-b",
            key_id="k2",
            model="m2",
            prompt_tokens=100,
            completion_tokens=50,
            queue_ms=float(i + 1),
            ttft_ms=None if i == 4 else 10.0 * (i + 1),
            finish_reason="stop",
            status="timeout" if i == 4 else "ok",
            created_at=DAY2 + 60 * i,
            end_user="u2",
        )
        for i in range(5)
    ]
    return a + b


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database of each kind holding `rows()`."""
    import asyncio

    async def fill(url: str) -> None:
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine).begin() as session:
                await insert_usage_rows(session, rows())
        finally:
            await engine.dispose()

    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('usage') / 'ft.db'}"
        upgrade(url)
        asyncio.run(fill(url))
        yield url
        return
    if not postgres_available():
        pytest.skip("PostgreSQL not reachable at FIRSTTOKEN_TEST_POSTGRES_URL")
    with postgres_database() as url:
        upgrade(url)
        asyncio.run(fill(url))
        yield url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(database_url)
    yield eng
    await eng.dispose()


async def report_list(engine: AsyncEngine, by: GroupBy, since: datetime) -> list[UsageGroup]:
    async with engine.connect() as conn:
        return await usage_report(conn, by=by, since=since)


async def report(engine: AsyncEngine, **kw: Any) -> dict[str | None, UsageGroup]:
    async with engine.connect() as conn:
        return {g.group: g for g in await usage_report(conn, **kw)}


async def test_per_tenant_counts_tokens_cost_and_hit_rates(engine: AsyncEngine) -> None:
    """Requests, errors (error and timeout), tokens, cost (NULL when nothing was priced, with
    the unpriced count) and hit rates per tier over the requests that looked in the cache."""
    got = await report(engine, by="tenant")
    a, b = got["t-a"], got["t-b"]
    assert (a.requests, a.errors, a.prompt_tokens, a.completion_tokens) == (100, 4, 1000, 500)
    assert a.cost == pytest.approx(0.1) and a.unpriced == 0
    assert (a.lookups, a.exact_hits, a.semantic_hits) == (90, 10, 5)
    assert a.hit_rate("exact") == pytest.approx(10 / 90)
    assert a.hit_rate("semantic") == pytest.approx(5 / 90)
    assert a.hit_rate() == pytest.approx(15 / 90)
    assert (b.requests, b.errors, b.cost, b.unpriced, b.lookups) == (5, 1, None, 5, 0)
    assert b.hit_rate() is None


async def test_percentiles_are_percentile_cont_on_both_databases(engine: AsyncEngine) -> None:
    """TTFT p50/p95/p99 and queue p95 interpolate as percentile_cont: 1..100 ms gives 50.5,
    95.05 and 99.01; NULL TTFTs are skipped (10, 20, 30, 40 gives 25, 38.5, 39.7)."""
    got = await report(engine, by="tenant")
    a, b = got["t-a"], got["t-b"]
    assert a.ttft_ms == pytest.approx({0.5: 50.5, 0.95: 95.05, 0.99: 99.01})
    assert a.queue_ms_p95 == pytest.approx(190.1)
    assert b.ttft_ms == pytest.approx({0.5: 25.0, 0.95: 38.5, 0.99: 39.7})
    assert b.queue_ms_p95 == pytest.approx(4.8)


async def test_by_end_user_day_model_and_key(engine: AsyncEngine) -> None:
    """Grouped by end user (rows without one are the None group, last), UTC day, model, key."""
    users = await report(engine, by="end_user")
    assert list(users) == ["u1", "u2", None]
    odd = [float(i) for i in range(1, 101, 2)]
    expected = {p: percentile_cont(odd, p) for p in (0.5, 0.95, 0.99)}
    assert users["u1"].requests == 50 and users["u1"].ttft_ms == pytest.approx(expected)
    assert users[None].requests == 50
    days = await report(engine, by="day")
    assert list(days) == ["2026-01-01", "2026-01-02"]
    assert days["2026-01-01"].ttft_ms == pytest.approx({0.5: 50.5, 0.95: 95.05, 0.99: 99.01})
    assert [g.requests for g in (await report(engine, by="model")).values()] == [100, 5]
    assert list(await report(engine, by="key")) == ["k1", "k2"]


async def test_postgres_report_on_bare_asyncpg_is_the_engines_and_sets_nothing_after(
    engine: AsyncEngine, database_url: str
) -> None:
    """On PostgreSQL, the command's path (a bare asyncpg connection) gives the same groups as
    an engine's connection, also inside a transaction already begun; its settings end with it."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    import asyncpg
    from sqlalchemy import text

    from firsttoken.usage.report import postgres_report
    from firsttoken.usagecli import asyncpg_dsn

    dsn = asyncpg_dsn(database_url)
    assert dsn is not None
    conn = await asyncpg.connect(dsn)
    try:
        before = await conn.fetchval("SHOW work_mem")
        for by in GROUP_BY:
            bare = await postgres_report(conn, by=by)
            async with engine.connect() as sa_conn:
                await sa_conn.execute(text("SELECT 1"))  # the transaction has begun
                assert await usage_report(sa_conn, by=by) == bare
        assert await conn.fetchval("SHOW work_mem") == before
        assert await conn.fetchval("SHOW enable_sort") == "on"
    finally:
        await conn.close()


async def test_since_and_until_bound_the_rows(engine: AsyncEngine) -> None:
    """since is inclusive and until exclusive."""
    day2 = datetime.fromtimestamp(DAY2, UTC)
    assert list(await report(engine, since=day2)) == ["t-b"]
    assert list(await report(engine, until=day2)) == ["t-a"]
    assert await report(engine, since=day2, until=day2) == {}


# --- the command ------------------------------------------------------------------------------


def usage_cmd(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python_cmd("-m", "firsttoken", "usage", *args),
        env=child_env(database_url=database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_prints_json_csv_and_a_table(database_url: str) -> None:
    """`firsttoken usage` reads FIRSTTOKEN_DATABASE_URL; json, csv and table carry the same
    groups."""
    out = usage_cmd(database_url, "--by", "model", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["model"] for d in data] == ["m1", "m2"]
    assert data[0]["ttft_p95_ms"] == pytest.approx(95.05) and data[1]["cost"] is None
    out = usage_cmd(database_url, "--by", "day", "--format", "csv", "--since", "2026-01-02")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("day,requests,errors,") and len(lines) == 2
    assert lines[1].startswith("2026-01-02,5,1,")
    out = usage_cmd(database_url, "--until", "2026-01-01")
    assert out.returncode == 0, out.stderr
    table = out.stdout.splitlines()
    assert table[0].split()[:3] == ["tenant", "requests", "errors"]
    assert table[1].split()[:3] == ["t-a", "100", "4"] and len(table) == 2


@pytest.mark.parametrize("by", GROUP_BY)
async def test_the_commands_json_is_the_reports(
    engine: AsyncEngine, database_url: str, by: GroupBy
) -> None:
    """The command (on PostgreSQL its bare asyncpg path) prints the report's groups as they
    are, for every grouping and within a window; by tenant, each with its id beside its name
    (these tenants have no row: the name is the id)."""
    args = ("--by", by, "--format", "json", "--since", "2026-01-01T00:00:30")
    out = usage_cmd(database_url, *args)
    assert out.returncode == 0, out.stderr
    since = datetime.fromtimestamp(DAY1 + 30, UTC)
    ids = (lambda g: {"tenant_id": g.group}) if by == "tenant" else (lambda g: {})
    groups = await report_list(engine, by, since)
    expected = [{by: g.group, **ids(g), **g.as_dict()} for g in groups]
    for row in expected:
        row.pop("group")
    assert json.loads(out.stdout) == expected


def test_plot_writes_a_png(database_url: str, tmp_path: Path) -> None:
    """--plot FILE writes one PNG chart (TTFT percentiles and hit rate per day)."""
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) is not installed")
    path = tmp_path / "usage.png"
    out = usage_cmd(database_url, "--plot", str(path))
    assert out.returncode == 0, out.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql+asyncpg://postgres:pw@127.0.0.1:1/ft", "cannot read usage from the database"),
        ("sqlite+aiosqlite:///{tmp}/absent.db", "no database at"),
    ],
)
def test_an_unreachable_database_is_a_clear_error(url: str, needle: str, tmp_path: Path) -> None:
    """Nothing listening, or no SQLite file: exit 1 with what is wrong, never a password."""
    out = usage_cmd(url.format(tmp=tmp_path))
    assert out.returncode == 1
    assert needle in out.stderr and "Traceback" not in out.stderr and "pw" not in out.stderr
    assert not (tmp_path / "absent.db").exists()


def test_an_unmigrated_database_says_to_migrate(tmp_path: Path) -> None:
    """A database without usage_events: exit 1 naming `firsttoken migrate`."""
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    out = usage_cmd(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    assert out.returncode == 1 and "firsttoken migrate" in out.stderr
    if not postgres_available():
        return
    with postgres_database() as url:  # not migrated: the asyncpg path says the same
        out = usage_cmd(url)
    assert out.returncode == 1 and "firsttoken migrate" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--since", "2026-02-30"], "'2026-02-30' is not a date: use YYYY-MM-DD"),
        (["--until", "yesterday"], "'yesterday' is not a date"),
        (["--since", "2026-01-02", "--until", "2026-01-01"], "--since must be before --until"),
        (["--by", "week"], "invalid choice: 'week'"),
    ],
)
def test_bad_arguments_exit_2_saying_what_is_wrong(
    args: list[str], needle: str, tmp_path: Path
) -> None:
    """A bad date, an empty window or an unknown grouping: exit 2 before any database work."""
    out = usage_cmd(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
