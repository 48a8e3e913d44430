"""Fault injection: real processes and real Redis/PostgreSQL servers of the tests' own, on free
ports, killed, stopped and restarted (issue 29). Every test here is marked `faults`; the README's
test command runs them. A test that cannot start its part is skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import make_url

# The real services, a migrated database with an API key, and a client, as the integration
# tests use.
from tests.integration.conftest import Services, connect, migrated, services  # noqa: F401
from tests.integration.test_persist_outage import TcpProxy
from tests.support import postgres_available


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def proxied_database(services: Services) -> Iterator[tuple[str, TcpProxy]]:  # noqa: F811
    """The run's PostgreSQL database behind a TCP proxy the test can take down: (URL, proxy)."""
    url = make_url(services.database_url)
    if url.get_backend_name() != "postgresql" or not postgres_available():
        pytest.skip("needs PostgreSQL (FIRSTTOKEN_TEST_POSTGRES_URL) to stop behind a proxy")
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    try:
        yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy
    finally:
        proxy.close()
