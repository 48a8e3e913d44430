"""The whole stack on a Redis primary with a replica and three Sentinels (issue 33): the
primary killed with chats streaming and more arriving; every chat ends with `done` or a clear
`error`, new chats succeed again within 10 s of the failover, and every `done` chat has its
one usage row."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.test_durable import Chats, _needs_postgres, _open, wait_rows
from tests.integration.conftest import Services, make_stack
from tests.sentinels import SentinelGroup, sentinel_group

pytestmark = pytest.mark.timeout(150)

# Long enough to be streaming through the failover: 60 tokens, 25 ms apart.
SIM = ("--ttft-ms", "20", "--itl-ms", "25", "--max-tokens", "1000")
IN_FLIGHT = 10
# Redis's target (issue 33): new chats succeed again within this long after the failover.
BACK_WITHIN_S = 10.0
# The codes a chat cut by the failover may end with: said clearly, retryable.
CLEAR_ERRORS = {"overloaded", "timeout", "engine_error"}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    g = sentinel_group(tmp_path / "redis")
    try:
        yield g
    finally:
        g.close()


async def _one_chat(stack: object, n: int) -> tuple[str, str]:
    """One short chat on a fresh socket: (job id, end type or error code)."""
    ws = await _open(stack)  # type: ignore[arg-type]
    try:
        chats = Chats(ws)
        await chats.start(1, lambda _: 8, prefix=f"after{n}-")
        await chats.read(Chats.all_ended, 15)
        chat = next(iter(chats.chats.values()))
        assert chat.end is not None
        return chat.job_id, chat.end.get("code", chat.end["type"])
    finally:
        await ws.close()


async def test_primary_killed_chats_end_clearly_new_ones_succeed_and_none_is_unbilled(
    services: Services, migrated: str, tmp_path: Path, group: SentinelGroup
) -> None:
    """SIGKILL of the primary with 10 chats streaming: each ends with `done` or a clear
    error, a new chat succeeds within 10 s of the promotion, and every chat that got `done`
    (before and after) has exactly one usage row."""
    _needs_postgres(services)
    on_sentinels = Services(group.url, services.database_url, [])
    with make_stack(
        on_sentinels, migrated, tmp_path, sim_args=SIM, worker_redis_outage_s="30"
    ) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        try:
            chats = Chats(ws)
            await chats.start(IN_FLIGHT, lambda i: 80 + i)
            await chats.read(Chats.all_streaming, 20)
            await asyncio.to_thread(group.failover)
            promoted_at = time.monotonic()
            after: list[tuple[str, str]] = []
            while not after or after[-1][1] != "done":
                assert time.monotonic() - promoted_at < BACK_WITHIN_S, (
                    f"no chat succeeded within {BACK_WITHIN_S:g}s of the failover: {after}"
                )
                after.append(await _one_chat(stack, len(after)))
                if after[-1][1] != "done":
                    await asyncio.sleep(0.2)
            back = time.monotonic() - promoted_at
            await chats.read(Chats.all_ended, 60)
        finally:
            await ws.close()
        ends = chats.ends()
        assert set(ends) <= {"done"} | CLEAR_ERRORS, ends
        done_jobs = [c.job_id for c in chats.done()] + [j for j, end in after if end == "done"]
        waited = await wait_rows(stack.services.database_url, done_jobs, 60)
        print(
            f"\nprimary killed: in flight {ends}; a new chat done {back:.1f}s after the "
            f"promotion ({len(after)} tries); {len(done_jobs)} usage rows, the last "
            f"{waited:.1f}s after"
        )
