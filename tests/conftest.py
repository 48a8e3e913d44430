"""Run-wide reporting: say loudly which real services were replaced and which tests skipped."""

from __future__ import annotations

from typing import Any

import pytest

from tests.summary import REPLACED, summary_sections, tier_of

# Every test belongs to the tier its folder names, and carries that tier's marker, so `-m`
# selects tiers. The default run (pyproject's addopts) is unit + integration; scripts/test.sh
# (the README's test command, and CI) runs every tier.
TIERS = ("unit", "integration", "faults", "cluster", "vllm", "browser")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.nodeid)
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: a test lives in one tier's folder, tests/<tier>/ "
                f"(one of {', '.join(TIERS)})"
            )
        item.add_marker(getattr(pytest.mark, tier))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    for title, colour, lines in summary_sections(REPLACED, skipped):
        markup = {colour: True, "bold": True}
        terminalreporter.write_sep("=", title, **markup)
        for line in lines:
            terminalreporter.write_line(line, **markup)
