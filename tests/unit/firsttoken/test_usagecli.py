"""`firsttoken usage`'s pure parts: dates, percentile interpolation, rendering, the plot's
missing-matplotlib message, the database URL and what the command imports."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from firsttoken.usage.groups import UsageGroup, interpolate, percentile_cont
from firsttoken.usage.report import postgres_sql
from firsttoken.usagecli import (
    PG_CONNECT_TIMEOUT_S,
    UsageError,
    asyncpg_dsn,
    database_url,
    parse_when,
    plot,
    render,
)

GROUP = UsageGroup(
    group="t-a",
    requests=10,
    errors=1,
    prompt_tokens=100,
    completion_tokens=50,
    cost=0.25,
    unpriced=0,
    exact_hits=2,
    semantic_hits=1,
    lookups=6,
    ttft_ms={0.5: 12.0, 0.95: 30.0, 0.99: None},
    queue_ms_p95=3.5,
)


def test_dates_are_utc_days_or_iso_times() -> None:
    """A day is its UTC midnight (for --until the next one); a naive time is UTC."""
    assert parse_when("2026-12-01") == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_when("2026-12-01", end_of_day=True) == datetime(2026, 12, 2, tzinfo=UTC)
    assert parse_when("2026-12-01T13:30") == datetime(2026, 12, 1, 13, 30, tzinfo=UTC)
    assert parse_when("2026-12-01T13:30+01:00") == datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="is not a date"):
        parse_when("12/01/2026")


def test_interpolation_is_percentile_cont() -> None:
    """Linear between the two nearest ranks, as PostgreSQL's percentile_cont."""
    assert percentile_cont(range(1, 101), 0.95) == pytest.approx(95.05)
    assert percentile_cont([10.0, 20.0, 30.0, 40.0], 0.5) == 25.0
    assert percentile_cont([7.0], 0.99) == 7.0
    assert percentile_cont([], 0.5) is None
    assert interpolate({3: 4.0, 4: 5.0}, 5, 0.95) == pytest.approx(4.8)


def test_json_and_csv_name_the_grouping_and_keep_nulls_as_nulls() -> None:
    """json: the group under the --by name, rates as fractions, None as null; csv: empty."""
    data = json.loads(render([GROUP], "json", "tenant"))
    assert data[0]["tenant"] == "t-a" and data[0]["hit_rate"] == 0.5
    assert data[0]["exact_hit_rate"] == pytest.approx(1 / 3) and data[0]["ttft_p99_ms"] is None
    header, row = render([GROUP], "csv", "tenant").splitlines()
    assert header.split(",")[:2] == ["tenant", "requests"]
    assert (
        row.split(",")[0] == "t-a" and row.split(",")[header.split(",").index("ttft_p99_ms")] == ""
    )


def test_the_table_has_one_line_per_group_and_says_when_empty() -> None:
    """A header and a line per group; '-' for unknown numbers; a note when nothing matched."""
    lines = render([GROUP], "table", "tenant").splitlines()
    assert lines[0].split()[:2] == ["tenant", "requests"]
    assert lines[1].split()[:6] == ["t-a", "10", "1", "100", "50", "0.250000"]
    assert lines[1].split()[-2:] == ["-", "3.5"]
    assert "(no usage in this window)" in render([], "table", "day")


def test_plot_without_matplotlib_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No matplotlib: a UsageError naming the bench extra, no file written."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"pip install 'firsttoken\[bench\]'"):
        plot([GROUP], tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_plain_asyncpg_urls_connect_directly_and_others_through_an_engine() -> None:
    """postgresql+asyncpg without options: an asyncpg DSN (password kept); SQLite, other
    drivers and URLs with options (SQLAlchemy's to read): None."""
    url = "postgresql+asyncpg://u:p%40ss@db:5433/ft"
    assert asyncpg_dsn(url) == "postgresql://u:p%40ss@db:5433/ft"
    assert asyncpg_dsn("postgresql+asyncpg://u@db/ft?ssl=require") is None
    assert asyncpg_dsn("postgresql+psycopg://u@db/ft") is None
    assert asyncpg_dsn("sqlite+aiosqlite:///x.db") is None


def test_the_database_url_is_the_settings_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIRSTTOKEN_DATABASE_URL in any case, as the settings read it; unset, their default."""
    from shared.settings import get_settings, load_settings

    monkeypatch.delenv("FIRSTTOKEN_DATABASE_URL", raising=False)
    get_settings.cache_clear()  # loaded once per process: this test's environment, not another's
    try:
        assert database_url() == load_settings().database_url
    finally:
        get_settings.cache_clear()
    monkeypatch.setenv("firsttoken_database_url", "sqlite+aiosqlite:///lower.db")
    assert database_url() == "sqlite+aiosqlite:///lower.db" == load_settings().database_url


def test_the_connect_timeout_is_the_sessions() -> None:
    """The command's asyncpg connect timeout is the engines' (spelled out to skip SQLAlchemy)."""
    from shared.db.session import PG_CONNECT_TIMEOUT_S as ENGINE_TIMEOUT

    assert PG_CONNECT_TIMEOUT_S == ENGINE_TIMEOUT


def test_the_usage_command_starts_without_sqlalchemy_or_the_settings() -> None:
    """Parsing `firsttoken usage` and loading the report imports neither SQLAlchemy, pydantic
    nor the other subcommands' modules (their imports are most of the command's start-up)."""
    code = (
        "import sys\n"
        "from firsttoken.cli import build_parser\n"
        "build_parser('usage').parse_args(['usage', '--by', 'day'])\n"
        "import asyncpg, firsttoken.usage.report, firsttoken.usage.groups\n"
        "heavy = ('sqlalchemy', 'pydantic', 'pydantic_settings', 'firsttoken.keyscli', 'redis')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_postgres_window_binds_only_the_bounds_given() -> None:
    """since and until are $1 and $2 when both are given; one alone is $1; none, no WHERE."""
    since, until = datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC)
    sql, args = postgres_sql("day", since, until)
    assert "created_at >= $1 AND created_at < $2" in sql and args == [since, until]
    sql, args = postgres_sql("tenant", None, until)
    assert "created_at < $1" in sql and "$2" not in sql and args == [until]
    sql, args = postgres_sql("key", None, None)
    assert "WHERE" not in sql.split("FROM usage_events")[1] and args == []
