"""Run-wide reporting: say loudly which real services were replaced and which tests skipped."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import pytest
from _pytest.mark.expression import Expression

from tests.summary import REPLACED, replaced, summary_sections, tier_of

# Every test belongs to the tier its folder names, and carries that tier's marker, so `-m`
# selects tiers. The default run (pyproject's addopts) is unit + integration; scripts/test.sh
# (the README's test command, and CI) runs every tier.
TIERS = ("unit", "integration", "faults", "cluster", "vllm", "browser")
# Tiers that kill servers, time failovers or drive a browser: one test at a time, so a timing
# they assert is not another test's load.
SERIAL_TIERS = ("faults", "cluster", "vllm", "browser")
# Processes for the other tiers: their time is mostly waiting on servers and workers, so two
# processes on two cores halve the run without starving a stack.
PROCESSES = 2


def processes_for(markexpr: str, env: str | None) -> int:
    """How many test processes `-n auto` starts (0: this one alone): PYTEST_XDIST_AUTO_NUM_WORKERS
    where set, else PROCESSES for a selection free of the serial tiers."""
    if env:
        return int(env)
    if not markexpr.strip():
        return 0  # every tier
    expression = Expression.compile(markexpr)
    if any(expression.evaluate(_only(tier)) for tier in SERIAL_TIERS):
        return 0
    return PROCESSES


def _only(tier: str) -> Any:
    """A marker matcher for a test that carries `tier`'s marker alone."""
    return lambda mark, **_: mark == tier


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return processes_for(config.option.markexpr, os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.nodeid)
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: a test lives in one tier's folder, tests/<tier>/ "
                f"(one of {', '.join(TIERS)})"
            )
        item.add_marker(getattr(pytest.mark, tier))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist process hands its stand-ins to the controller, which prints the summary.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["replaced"] = [asdict(entry) for entry in REPLACED]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for entry in getattr(node, "workeroutput", {}).get("replaced", []):
        replaced(**entry)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    for title, colour, lines in summary_sections(REPLACED, skipped):
        markup = {colour: True, "bold": True}
        terminalreporter.write_sep("=", title, **markup)
        for line in lines:
            terminalreporter.write_line(line, **markup)
