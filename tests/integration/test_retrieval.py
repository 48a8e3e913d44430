"""Parallel retrieval on the real stack: a source past its deadline is skipped, not waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Services, Stack
from tests.integration.issue5 import ask, client, issue5_stack, new_tenant
from workers.retrieval.gather import Query, gather_sources

pytestmark = pytest.mark.integration

DEADLINE_MS = 300


@pytest.fixture(scope="module")
def slow_stack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # The probe source sleeps 5 s; every database source has a 300 ms deadline.
    with issue5_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("logs5r"),
        retrieval_probe_ms="5000",
        retrieval_db_deadline_ms=str(DEADLINE_MS),
        stream_idle_timeout_s="10",
    ) as s:
        yield s


async def test_slow_source_delays_first_token_by_at_most_its_deadline(slow_stack: Stack) -> None:
    """A source sleeping 5 s past its 300 ms deadline is skipped and flagged; the chat answers
    and the retrieval stage took no longer than the deadline (plus scheduling slack)."""
    _, _, key = await new_tenant(slow_stack.services.database_url)
    c = await client(slow_stack, key)
    try:
        for i in range(3):
            done = await ask(c, f"s{i}", f"hello {i}", cache=False)
            assert done["type"] == "done", done
            probe = done["retrieval"]["sources"]["probe"]
            assert probe["status"] == "timeout"
            assert "probe" in done["retrieval"]["skipped"]
            assert done["retrieval"]["sources"]["user"]["status"] == "ok"
            # 150 ms of slack: a 2-core machine shared with other test runs.
            assert done["timings"]["retrieval_ms"] < DEADLINE_MS + 150, done["timings"]
            assert done["timings"]["ttft_ms"] < 5000
    finally:
        await c.ws.close()


class _Sleeper:
    def __init__(self, name: str, sleep_s: float, deadline_s: float, fail: bool = False) -> None:
        self.name, self.sleep_s, self.deadline_s, self.fail = name, sleep_s, deadline_s, fail

    async def fetch(self, query: Query) -> str:
        await asyncio.sleep(self.sleep_s)
        if self.fail:
            raise RuntimeError("boom")
        return self.name


async def test_sources_run_concurrently_and_failures_degrade() -> None:
    """200/350/50 ms sources take about the longest, not the sum; a failing one is flagged."""
    sources = [
        _Sleeper("a", 0.2, 1.0),
        _Sleeper("b", 0.35, 1.0),
        _Sleeper("c", 0.05, 1.0),
        _Sleeper("bad", 0.01, 1.0, fail=True),
    ]
    start = time.perf_counter()
    results = await gather_sources(sources, Query("t", "q"))
    elapsed = time.perf_counter() - start
    assert 0.35 <= elapsed < 0.5
    assert [r.status for r in results.values()] == ["ok", "ok", "ok", "error"]
    assert results["b"].value == "b"


async def test_start_up_compiles_every_source_query(services: Services, migrated: str) -> None:
    """After `warm_queries` (a worker's start-up), the first chat of a tenant runs only
    statements SQLAlchemy has already compiled, and the warm-up itself caches no tenant."""
    from sqlalchemy import event
    from sqlalchemy.engine.default import CACHE_HIT

    from workers.db import Database
    from workers.retrieval import sources

    db = Database(services.database_url)
    _, tenant_id, _ = await new_tenant(services.database_url)
    db.sessionmaker()
    assert db._engine is not None
    try:
        await sources.warm_queries(db)
        assert sources._tenant_cache.held(("prompt", sources.WARM_UP_TENANT), None) is None
        hits: list[object] = []

        @event.listens_for(db._engine.sync_engine, "after_cursor_execute")
        def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            hits.append(context.cache_hit)

        query = Query(tenant_id, "hello", f"conv-{tenant_id}")
        await sources.UserSource(db, 1.0)._load(query)
        await sources._kb_version_loader(db, query)()
        state = await sources.ConversationSource(db, 1.0, new=False).fetch(query)
        assert state is not None and not state.found  # no such conversation
        assert len(hits) == 3
        assert all(hit is CACHE_HIT for hit in hits), hits
    finally:
        await db.close()
