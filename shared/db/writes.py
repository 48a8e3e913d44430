"""Idempotent writes keyed on request_id: running one twice (a task redelivered after a crash,
a retry after a timeout that had in fact committed) inserts nothing the second time.

They never commit; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import Conversation, MessageRow, UsageEvent
from shared.tasks import MessagesRecord, UsageRecord

# Declarative `__table__` is typed as a FromClause; these are Tables.
_USAGE = cast(Table, UsageEvent.__table__)
_MESSAGES = cast(Table, MessageRow.__table__)
_CONVERSATIONS = cast(Table, Conversation.__table__)


def from_unix(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


async def insert_ignore(
    session: AsyncSession, table: Table, rows: Sequence[dict[str, Any]], conflict: Sequence[str]
) -> int:
    """INSERT rows, skipping any that hit the unique key `conflict`; returns how many went in.

    RETURNING (not rowcount) counts the inserted rows: it is exact on both dialects, and
    PostgreSQL and SQLite (>= 3.35) return nothing for a row the conflict clause skipped.
    """
    if not rows:
        return 0
    name = session.get_bind().dialect.name
    if name == "postgresql":
        stmt: Any = postgresql.insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    elif name == "sqlite":
        stmt = sqlite.insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    else:  # pragma: no cover - the two supported databases
        raise NotImplementedError(f"no idempotent insert for dialect {name!r}")
    # The rows as parameters, not in the statement: one compiled statement for every batch
    # (rows in `values()` made each one uncacheable), sent as one multi-row INSERT.
    result = await session.execute(stmt.returning(*table.primary_key.columns), list(rows))
    return len(result.all())


async def insert_usage(session: AsyncSession, usage: UsageRecord) -> bool:
    """Insert one usage row; False when a row for its request_id already exists."""
    return await insert_usage_rows(session, [usage]) == 1


async def insert_usage_rows(session: AsyncSession, usage: Sequence[UsageRecord]) -> int:
    """Insert usage rows in one statement; returns how many were new (see insert_ignore)."""
    rows = []
    for record in usage:
        row = record.model_dump()
        row["created_at"] = from_unix(record.created_at)
        rows.append(row)
    return await insert_ignore(session, _USAGE, rows, ["request_id"])


async def insert_messages(session: AsyncSession, record: MessagesRecord) -> int:
    """Insert the turn (prompt messages, then the answer); returns how many rows were new.

    Each message is keyed on (request_id, position), so a rewrite of the turn adds nothing.
    """
    created_at = from_unix(record.created_at)
    if record.conversation_id is not None:
        await _touch_conversation(session, record.conversation_id, record.tenant_id, created_at)
    turn: list[tuple[str, str, str | None]] = [(m.role, m.content, None) for m in record.messages]
    turn.append(("assistant", record.answer, record.model))
    rows = [
        {
            "request_id": record.request_id,
            "position": position,
            "conversation_id": record.conversation_id,
            "tenant_id": record.tenant_id,
            "role": role,
            "content": content,
            "model": model,
            "created_at": created_at,
        }
        for position, (role, content, model) in enumerate(turn)
    ]
    return await insert_ignore(session, _MESSAGES, rows, ["request_id", "position"])


async def _touch_conversation(
    session: AsyncSession, conversation_id: str, tenant_id: str, at: datetime
) -> None:
    row = {"id": conversation_id, "tenant_id": tenant_id, "created_at": at, "updated_at": at}
    if not await insert_ignore(session, _CONVERSATIONS, [row], ["id"]):
        # Only forward: a late or replayed turn must not move updated_at back in time.
        await session.execute(
            update(Conversation)
            .where(Conversation.id == conversation_id, Conversation.updated_at < at)
            .values(updated_at=at)
        )
