"""Fault injection: real processes and real Redis/PostgreSQL servers of the tests' own, on free
ports, killed, stopped and restarted (issue 29). Every test here is marked `faults`; the README's
test command runs them. A test that cannot start its part is skipped with the reason."""

from __future__ import annotations

import pytest

# The real services, a migrated database with an API key, and a client, as the integration
# tests use.
from tests.integration.conftest import connect, migrated, services  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.integration)
