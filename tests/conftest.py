"""Run-wide reporting: say which real services the integration tests had to leave out."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    try:
        from tests.integration.conftest import LEFT_OUT
    except ImportError:
        return
    if LEFT_OUT:
        terminalreporter.write_sep("-", "left out (embedded defaults used instead)")
        for item in LEFT_OUT:
            terminalreporter.write_line(f"  {item}")
