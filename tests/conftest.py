"""Run-wide reporting: say loudly which real services were replaced and which tests skipped."""

from __future__ import annotations

from typing import Any

from tests.summary import REPLACED, summary_sections


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    for title, colour, lines in summary_sections(REPLACED, skipped):
        markup = {colour: True, "bold": True}
        terminalreporter.write_sep("=", title, **markup)
        for line in lines:
            terminalreporter.write_line(line, **markup)
