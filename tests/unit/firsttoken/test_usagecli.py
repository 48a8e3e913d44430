"""`firsttoken usage`'s pure parts: dates, percentile interpolation, rendering, the plot's
missing-matplotlib message."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from firsttoken.usagecli import GROUP_BY_CHOICES, UsageError, parse_when, plot, render
from shared.db.usage_report import GROUP_BY, UsageGroup, interpolate, percentile_cont

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


def test_the_commands_groupings_are_the_reports() -> None:
    """--by offers exactly the groupings the report knows."""
    assert GROUP_BY_CHOICES == GROUP_BY
