"""Durable writes on the `bulk` queue: usage rows (one per task, or a chat worker's batch of
them, see workers/chat/usage.py) and (when `store_text`) the turn's messages.

A usage row leaves the usage outbox (shared/usage_outbox.py) once its write committed, and its
due time moves on while its task waits out a retry; a task lost before it got here leaves the
row there for a sweep to send again.

Each task validates its JSON payload into the shared model and runs an idempotent write
(keyed on request_id) on the process loop. While the database is unavailable the task is
retried with capped, jittered exponential backoff; `acks_late` keeps the message in Redis until
the write committed, so an outage delays rows but never loses or duplicates them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from celery import Task
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.errors import DatabaseUnavailable, is_retryable
from shared.db.writes import insert_messages, insert_usage_rows
from shared.keys import PERSIST_MESSAGES_TASK, PERSIST_USAGE_BATCH_TASK, PERSIST_USAGE_TASK
from shared.redis import scripts
from shared.redis.pipe import RedisPipe
from shared.settings import get_settings
from shared.tasks import MessagesRecord, UsageRecord
from workers.app import app
from workers.db import Database
from workers.lifecycle import lifecycle
from workers.runtime import runner

log = logging.getLogger(__name__)
settings = get_settings()

R = TypeVar("R")
T = TypeVar("T")

# The one place retries are declared. Only DatabaseUnavailable is retried: `_write` raises it
# for the driver errors `shared.db.errors.is_retryable` accepts; anything else (a payload that
# does not validate, a constraint violation) fails at once instead of looping.
DURABLE_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (DatabaseUnavailable,),
    "retry_backoff": True,
    "retry_backoff_max": settings.persist_retry_backoff_max_s,
    "retry_jitter": True,
    "max_retries": settings.persist_max_retries,
}


async def _write(
    db: Database, write: Callable[[AsyncSession, R], Awaitable[T]], record: R, what: str
) -> T:
    try:
        async with db.sessionmaker().begin() as session:
            return await write(session, record)
    except Exception as exc:
        if not is_retryable(exc):
            raise
        # The pool's connections died with the server; keep none of them for the next try.
        await db.reset_pool()
        raise DatabaseUnavailable(f"database unavailable for {what}: {exc!r}") from exc


async def _write_usage(records: list[UsageRecord], label: str) -> int:
    """Write the rows, then take them out of the outbox (or, while the task is retried, keep
    a sweep from sending them again)."""
    ctx = await lifecycle.context()
    keys, ids = ctx.keys, [record.request_id for record in records]
    try:
        written = await _write(ctx.db, insert_usage_rows, records, label)
    except DatabaseUnavailable:
        resend_after_ms = int(settings.usage_resend_after_s * 1000)
        _on_pipe(ctx.pipe, scripts.USAGE_TOUCH, [keys.usage_due], [resend_after_ms, *ids])
        raise
    _on_pipe(ctx.pipe, scripts.USAGE_WRITTEN, [keys.usage_due, keys.usage_rows], ids)
    return written


async def _write_messages(record: MessagesRecord) -> int:
    ctx = await lifecycle.context()
    return await _write(ctx.db, insert_messages, record, record.request_id)


def _on_pipe(
    pipe: RedisPipe, script: scripts.LuaScript, keys: Sequence[str], args: Sequence[str | int]
) -> None:
    # Queued, not awaited: a row whose removal is lost to a Redis outage is sent once more and
    # written once.
    try:
        pipe.script(script).send(keys, args)
    except ConnectionError:
        log.warning("Redis unreachable: usage rows stay in the outbox (%d)", len(args))


def _note_retry(task: Task, what: str) -> None:
    # First failure only: a long outage would otherwise log every retry of every task.
    if task.request.retries == 0:
        log.warning("database unavailable; %s for %s will be retried", task.name, what)


@app.task(name=PERSIST_USAGE_TASK, **DURABLE_TASK_OPTIONS)
def persist_usage(self: Task, usage: dict[str, Any]) -> bool:
    """Write one usage row; True when it was new."""
    record = UsageRecord.model_validate(usage)
    try:
        return runner.run(_write_usage([record], record.request_id)) == 1
    except DatabaseUnavailable:
        _note_retry(self, record.request_id)
        raise


@app.task(name=PERSIST_USAGE_BATCH_TASK, **DURABLE_TASK_OPTIONS)
def persist_usage_batch(self: Task, usage: list[dict[str, Any]]) -> int:
    """Write a chat worker's batch of usage rows in one transaction; returns how many were new.

    All or nothing: a retry after an outage rewrites the whole batch, and rows that did land
    before (a commit whose reply was lost) are skipped by their request_id.
    """
    records = [UsageRecord.model_validate(row) for row in usage]
    label = f"{len(records)} usage rows ({records[0].request_id}, ...)" if records else "0 rows"
    try:
        return runner.run(_write_usage(records, label))
    except DatabaseUnavailable:
        _note_retry(self, label)
        raise


@app.task(name=PERSIST_MESSAGES_TASK, **DURABLE_TASK_OPTIONS)
def persist_messages(self: Task, messages: dict[str, Any]) -> int:
    """Write one turn's messages; returns how many rows were new."""
    record = MessagesRecord.model_validate(messages)
    if not settings.store_text:
        # Enqueued before an operator turned store_text off: the text must not land.
        return 0
    try:
        return runner.run(_write_messages(record))
    except DatabaseUnavailable:
        _note_retry(self, record.request_id)
        raise
