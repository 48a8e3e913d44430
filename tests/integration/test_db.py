"""Migrations, idempotent writes, the usage_daily view and API keys on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from firsttoken.migrate import upgrade, upgrade_engine
from shared.db.apikeys import create_tenant_and_key, hash_key, lookup_key, revoke_key
from shared.db.models import Base, Conversation, MessageRow, UsageEvent
from shared.db.session import make_engine, make_sessionmaker, ping
from shared.db.writes import from_unix, insert_messages, insert_usage
from shared.protocol import Message
from shared.tasks import MessagesRecord, UsageRecord
from tests.support import postgres_available, postgres_database

pytestmark = pytest.mark.integration

DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A freshly migrated database of each kind (migrated synchronously, outside any loop)."""
    if request.param == "sqlite":
        # A directory that does not exist yet: make_engine must create it.
        path = tmp_path_factory.mktemp("db") / "nested" / "ft.db"
        url = f"sqlite+aiosqlite:///{path}"
        upgrade(url)
        assert Path(path).exists()
        yield url
        return
    if not postgres_available():
        pytest.skip(
            "PostgreSQL not reachable at FIRSTTOKEN_TEST_POSTGRES_URL "
            "(default postgresql://postgres@127.0.0.1:5432/postgres)"
        )
    with postgres_database() as url:
        upgrade(url)
        upgrade(url)  # a second run at head is a no-op
        yield url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(database_url)
    yield eng
    await eng.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return make_sessionmaker(engine)


def usage(request_id: str, **over: object) -> UsageRecord:
    values: dict[str, object] = {
        "request_id": request_id,
        "tenant_id": "t-usage",
        "key_id": "k1",
        "model": "sim",
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "ttft_ms": 30.0,
        "total_ms": 100.0,
        "finish_reason": "stop",
        "status": "ok",
        "created_at": DAY + 3600,
    }
    values.update(over)
    return UsageRecord.model_validate(values)


def _schema_diff(conn: Connection) -> list[object]:
    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(ctx, Base.metadata))


async def test_migrated_schema_matches_models(engine: AsyncEngine) -> None:
    """After upgrade to head, the database schema has nothing the models lack or vice versa."""
    await ping(engine)
    async with engine.connect() as conn:
        assert await conn.run_sync(_schema_diff) == []


async def test_upgrade_engine_runs_inside_a_loop(engine: AsyncEngine) -> None:
    """upgrade_engine migrates over an existing engine from async code (here: already at head)."""
    await upgrade_engine(engine)
    async with engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    from alembic.script import ScriptDirectory

    from firsttoken.migrate import alembic_config

    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()


async def test_insert_usage_is_idempotent(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Writing the same request_id twice inserts one row; the second write reports False."""
    record = usage("req-idem")
    async with sessions.begin() as s:
        assert await insert_usage(s, record) is True
    async with sessions.begin() as s:
        assert await insert_usage(s, record.model_copy(update={"model": "other"})) is False
    async with sessions() as s:
        rows = (
            (await s.execute(select(UsageEvent).where(UsageEvent.request_id == "req-idem")))
            .scalars()
            .all()
        )
    assert len(rows) == 1
    assert rows[0].model == "sim" and rows[0].completion_tokens == 20


async def test_usage_batches_share_one_compiled_insert(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A batch of usage rows is one INSERT whose compiled form is reused by every later batch,
    whatever its size, and rows already written are skipped and not counted."""
    from sqlalchemy import event
    from sqlalchemy.engine.default import CACHE_HIT

    from shared.db.writes import insert_usage_rows

    seen: list[tuple[object, int]] = []

    def after(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if "usage_events" in statement:
            seen.append((context.cache_hit, statement.count("request_id")))

    event.listen(engine.sync_engine, "after_cursor_execute", after)
    try:
        async with sessions.begin() as s:
            assert await insert_usage_rows(s, [usage(f"req-b1-{i}") for i in range(3)]) == 3
        async with sessions.begin() as s:
            batch = [usage("req-b1-0"), *(usage(f"req-b2-{i}") for i in range(4))]
            assert await insert_usage_rows(s, batch) == 4  # req-b1-0 was already there
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", after)
    assert seen[-1][0] is CACHE_HIT, seen  # the 5-row batch reused the 3-row batch's statement
    assert len(seen) == 2  # one statement per batch


async def test_usage_daily_rolls_up(sessions: async_sessionmaker[AsyncSession]) -> None:
    """usage_daily sums requests, cached hits, tokens and errors per UTC day, tenant and model."""
    tenant = f"t-daily-{time.monotonic_ns()}"
    records = [
        usage("d1", tenant_id=tenant, ttft_ms=10.0, total_ms=100.0),
        usage(
            "d2",
            tenant_id=tenant,
            cached=True,
            ttft_ms=30.0,
            total_ms=300.0,
            prompt_tokens=5,
            completion_tokens=0,
        ),
        usage(
            "d3",
            tenant_id=tenant,
            status="error",
            ttft_ms=None,
            total_ms=None,
            finish_reason="error",
            created_at=DAY + 86_399,
        ),
        usage("d4", tenant_id=tenant, status="cancelled", created_at=DAY + 86_400 + 5),
    ]
    records = [r.model_copy(update={"request_id": f"{tenant}-{r.request_id}"}) for r in records]
    async with sessions.begin() as s:
        for r in records:
            await insert_usage(s, r)
    async with sessions() as s:
        rows = (
            await s.execute(
                text(
                    "SELECT day, model, requests, cached_requests, prompt_tokens, "
                    "completion_tokens,"
                    " avg_ttft_ms, avg_total_ms, errors FROM usage_daily WHERE tenant_id = :t"
                    " ORDER BY day"
                ),
                {"t": tenant},
            )
        ).all()
    assert [str(r.day) for r in rows] == ["2026-01-01", "2026-01-02"]
    first, second = rows
    assert (first.model, first.requests, first.cached_requests) == ("sim", 3, 1)
    assert (first.prompt_tokens, first.completion_tokens) == (25, 40)
    assert float(first.avg_ttft_ms) == pytest.approx(20.0)
    assert float(first.avg_total_ms) == pytest.approx(200.0)
    assert first.errors == 1
    assert (second.requests, second.errors) == (1, 0)  # cancelled is not an error


async def test_insert_messages_is_idempotent(sessions: async_sessionmaker[AsyncSession]) -> None:
    """A turn is stored as prompt messages plus the answer, once, however often it is written."""
    record = MessagesRecord(
        request_id=f"m-{time.monotonic_ns()}",
        tenant_id="t-msg",
        conversation_id="conv-1",
        messages=[Message(role="system", content="be brief"), Message(role="user", content="hi")],
        answer="hello",
        model="sim",
        created_at=DAY,
    )
    async with sessions.begin() as s:
        assert await insert_messages(s, record) == 3
    async with sessions.begin() as s:
        assert await insert_messages(s, record) == 0
    async with sessions() as s:
        rows = (
            await s.execute(
                select(MessageRow.role, MessageRow.content, MessageRow.model)
                .where(MessageRow.request_id == record.request_id)
                .order_by(MessageRow.position)
            )
        ).all()
        conversations = (
            await s.execute(text("SELECT count(*) FROM conversations WHERE id = 'conv-1'"))
        ).scalar()
    assert [tuple(r) for r in rows] == [
        ("system", "be brief", None),
        ("user", "hi", None),
        ("assistant", "hello", "sim"),
    ]
    assert conversations == 1


async def test_text_with_nul_is_stored_with_the_replacement_character(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A turn and a summary containing U+0000 are stored (PostgreSQL text cannot hold NUL) with
    U+FFFD in its place, the same on both databases; the rest of the text is kept as sent."""
    conv_id = f"conv-nul-{time.monotonic_ns()}"
    record = MessagesRecord(
        request_id=f"m-nul-{time.monotonic_ns()}",
        tenant_id="t-msg",
        conversation_id=conv_id,
        messages=[Message(role="user", content="a\x00b\x00")],
        answer="\x00answer",
        model="sim",
        created_at=DAY,
    )
    async with sessions.begin() as s:
        assert await insert_messages(s, record) == 2
    async with sessions.begin() as s:
        await s.execute(
            update(Conversation).where(Conversation.id == conv_id).values(summary="s\x00um")
        )
    async with sessions() as s:
        rows = (
            await s.execute(
                select(MessageRow.content)
                .where(MessageRow.request_id == record.request_id)
                .order_by(MessageRow.position)
            )
        ).scalars()
        summary = (
            await s.execute(select(Conversation.summary).where(Conversation.id == conv_id))
        ).scalar()
    assert list(rows) == ["a\ufffdb\ufffd", "\ufffdanswer"]
    assert summary == "s\ufffdum"


async def test_a_failed_statement_does_not_carry_its_text_into_the_error(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A write that fails (here a NOT NULL column left empty) raises an error whose message,
    as a log line would print it, holds none of the bound values (the turn's text)."""
    sentinel = f"secret-{time.monotonic_ns()}"
    row = {"request_id": None, "position": 0, "tenant_id": "t", "role": "user",
           "content": sentinel, "created_at": from_unix(DAY)}  # fmt: skip
    with pytest.raises(DBAPIError) as info:
        async with sessions.begin() as s:
            await s.execute(insert(MessageRow), [row])
    assert sentinel not in str(info.value) and sentinel not in repr(info.value)


async def test_create_tenant_and_key_is_idempotent(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Creating the same tenant and explicit key twice returns the same ids and one key row."""
    name = f"dev-{time.monotonic_ns()}"
    async with sessions.begin() as s:
        first = await create_tenant_and_key(s, name, key="ft-dev-key-123456")
    async with sessions.begin() as s:
        second = await create_tenant_and_key(s, name, key="ft-dev-key-123456")
    assert first == second
    async with sessions.begin() as s:
        tenant_id, key_id, key = await create_tenant_and_key(s, name)  # a second, generated key
    assert tenant_id == first[0] and key_id != first[1] and key.startswith("ft-")
    async with sessions() as s:
        tenants = (
            await s.execute(text("SELECT count(*) FROM tenants WHERE name = :n"), {"n": name})
        ).scalar()
        prefix = (
            await s.execute(text("SELECT prefix FROM api_keys WHERE id = :i"), {"i": first[1]})
        ).scalar()
    assert tenants == 1
    assert prefix == "ft-dev-k"


async def test_lookup_and_revoke(sessions: async_sessionmaker[AsyncSession]) -> None:
    """A key is found by its hash with its tenant and scope; after revoke it reads as revoked."""
    async with sessions.begin() as s:
        tenant_id, key_id, key = await create_tenant_and_key(
            s, f"acme-{time.monotonic_ns()}", scope="admin"
        )
    async with sessions() as s:
        info = await lookup_key(s, hash_key(key))
        assert await lookup_key(s, hash_key(key + "nope")) is None
    assert info is not None
    assert (info.tenant_id, info.key_id, info.scope, info.revoked) == (
        tenant_id,
        key_id,
        "admin",
        False,
    )
    async with sessions.begin() as s:
        assert await revoke_key(s, key_id) is True
    async with sessions.begin() as s:
        assert await revoke_key(s, key_id) is False  # already revoked
        assert await revoke_key(s, "no-such-key") is False
    async with sessions() as s:
        info = await lookup_key(s, hash_key(key))
    assert info is not None and info.revoked


async def test_usage_rows_keep_the_analysts_fields(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Cost, end user, tags (object or array), conversation, cache tier and cached prompt
    tokens are stored as given; a row without them reads back NULL, not 0."""
    full = usage(
        "req-analytics",
        cost=0.00125,
        end_user="u-1",
        tags={"team": "search"},
        conversation_id="conv-1",
        cache_tier="semantic",
        cached_prompt_tokens=7,
    )
    listed = usage("req-analytics-list", tags=["beta", "mobile"])
    async with sessions.begin() as s:
        await insert_usage(s, full)
        await insert_usage(s, listed)
    async with sessions() as s:
        rows = {
            r.request_id: r
            for r in (
                await s.execute(
                    select(UsageEvent).where(UsageEvent.request_id.like("req-analytics%"))
                )
            ).scalars()
        }
    got = rows["req-analytics"]
    assert (got.cost, got.end_user, got.tags, got.conversation_id) == (
        0.00125,
        "u-1",
        {"team": "search"},
        "conv-1",
    )
    assert (got.cache_tier, got.cached_prompt_tokens) == ("semantic", 7)
    bare = rows["req-analytics-list"]
    assert bare.tags == ["beta", "mobile"]
    assert (bare.cost, bare.end_user, bare.cache_tier, bare.cached_prompt_tokens) == (
        None,
        None,
        None,
        None,
    )
