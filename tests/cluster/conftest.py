"""The cluster test bed's fixture (tests/cluster/bed.py). Every test here is marked `cluster`
(the README's test command runs them); skipped, saying why, where network namespaces cannot be
made, HAProxy or Redis Sentinel is missing, or there is no PostgreSQL to forward."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from sqlalchemy import make_url

from tests.cluster.bed import Bed, bring_up
from tests.cluster.netns import can_make_namespaces

# The real services and a migrated database with an API key, as the integration tests use.
from tests.integration.conftest import Services, migrated, services  # noqa: F401
from tests.support import postgres_available


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)


def _why_not(run: Services) -> str | None:
    if make_url(run.database_url).get_backend_name() != "postgresql" or not (postgres_available()):
        return "needs PostgreSQL (FIRSTTOKEN_TEST_POSTGRES_URL) to forward into the bed"
    if shutil.which("haproxy") is None:
        return "needs Debian's haproxy (apt-get install haproxy; .ci/run does)"
    if shutil.which("redis-server") is None:
        return "needs redis-server and redis-sentinel (apt-get install redis-sentinel)"
    return can_make_namespaces()


@pytest.fixture(scope="module")
def bed(
    services: Services,  # noqa: F811
    migrated: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bed]:
    """The whole bed, up once for the module's tests (in file order; a test that takes a
    host down says so, and later tests use what is left)."""
    why = _why_not(services)
    if why is not None:
        pytest.skip(why)
    b = bring_up(tmp_path_factory.mktemp("cluster"), services.database_url, migrated)
    try:
        yield b
    finally:
        b.close()
