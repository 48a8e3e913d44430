"""Two minutes at 20 chats/s while chat workers and the bulk worker are SIGKILLed and restarted
at random (issue 29): every chat ends with `done` or `error`, its token seqs are contiguous, and
every `done` has one usage row, none two."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from sqlalchemy import text

from shared.db.session import make_engine
from tests.integration.conftest import Services, Stack, make_stack

SOAK_S = 120.0
RATE = 20.0  # chats a second, over all sockets
SOCKETS = 8
CHAT_WORKERS = 3
# Every chat must end within this of the load's end (a hang would not).
DRAIN_S = 30.0
SEED = 29

pytestmark = pytest.mark.timeout(int(SOAK_S + DRAIN_S + 150))

# No limit stands between the load and the stack: a refusal would hide what the kills do.
UNLIMITED = {
    "key_rpm_default": "0",
    "key_tpm_default": "0",
    "tenant_rpm_default": "0",
    "tenant_tpm_default": "0",
    "key_max_streams_default": "0",
    "max_streams_per_connection": "256",
    "worker_lost_after_s": "2",
    "queue_deadline_s": "10",
    "stream_idle_timeout_s": "5",
    # A bulk task lost with a killed bulk worker is sent again this long after it was queued
    # (shared/usage_outbox.py): sooner than the default, so the rows' wait fits the test.
    "usage_resend_after_s": "35",
}


@dataclass
class Chat:
    job_id: str | None = None
    seqs: list[int] = field(default_factory=list)
    end: dict[str, Any] | None = None


@dataclass
class Tally:
    """Every chat sent, by id; `all_ended` is set once the load is over and each has ended."""

    chats: dict[str, Chat] = field(default_factory=dict)
    ended: int = 0
    sending: bool = True
    all_ended: asyncio.Event = field(default_factory=asyncio.Event)

    def check(self) -> None:
        if not self.sending and self.ended == len(self.chats):
            self.all_ended.set()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


async def _read(ws: Any, tally: Tally) -> None:
    async for raw in ws:
        frame = json.loads(raw)
        chat = tally.chats.get(frame.get("id") or "")
        if chat is None:
            continue
        kind = frame["type"]
        if kind == "accepted":
            chat.job_id = str(frame["job_id"])
        elif kind == "token":
            chat.seqs.append(int(frame["seq"]))
        elif kind in ("done", "error") and chat.end is None:
            chat.end = frame
            tally.ended += 1
            tally.check()


async def _load(stack: Stack, tally: Tally, stop_at: float) -> list[Any]:
    """Open the sockets and send chats round-robin at RATE until `stop_at`."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    sockets = [
        await websockets.connect(stack.ws_url, additional_headers=headers, max_queue=None)
        for _ in range(SOCKETS)
    ]
    readers = [asyncio.ensure_future(_read(ws, tally)) for ws in sockets]
    n = 0
    start = time.monotonic()
    while time.monotonic() < stop_at:
        chat_id = f"s{n}"
        tally.chats[chat_id] = Chat()
        frame = {
            "type": "chat",
            "id": chat_id,
            "messages": [{"role": "user", "content": f"soak question {n}"}],
            "max_tokens": 24,
            "cache": False,
        }
        await sockets[n % SOCKETS].send(json.dumps(frame))
        n += 1
        await asyncio.sleep(max(0.0, start + n / RATE - time.monotonic()))
    tally.sending = False
    tally.check()
    return [sockets, readers]


async def _kill_at_random(stack: Stack, stop_at: float, rng: random.Random) -> list[str]:
    """SIGKILL a random chat worker (now and then the bulk worker) every 8-16 s and start a new
    one under the same name; returns what was killed, in order."""
    killed: list[str] = []
    while True:
        await asyncio.sleep(rng.uniform(8, 16))
        if time.monotonic() >= stop_at - 5:
            return killed
        name = "bulk" if rng.random() < 0.2 else f"chat{rng.randrange(CHAT_WORKERS)}"
        stack.procs[name].kill()
        killed.append(name)
        stack.start_worker(name, "bulk" if name == "bulk" else "chat")


async def _usage(stack: Stack, job_ids: list[str], timeout: float) -> dict[str, list[str]]:
    """request_id -> the statuses of its rows, once every one of `job_ids` has one."""
    engine = make_engine(stack.services.database_url)
    rows: dict[str, list[str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                result = await conn.execute(
                    text(
                        "SELECT request_id, status FROM usage_events WHERE request_id = ANY(:ids)"
                    ),
                    {"ids": job_ids},
                )
                rows = {}
                for request_id, status in result:
                    rows.setdefault(str(request_id), []).append(str(status))
            if len(rows) >= len(job_ids):
                break
            await asyncio.sleep(1.0)
    finally:
        await engine.dispose()
    return rows


async def test_two_minutes_of_random_worker_kills_lose_no_chat_and_no_row(
    services: Services, migrated: str, logs: Path
) -> None:
    if not services.database_url.startswith("postgresql"):
        pytest.skip("the soak counts usage rows in PostgreSQL (FIRSTTOKEN_TEST_POSTGRES_URL)")
    rng = random.Random(SEED)
    sim = ("--ttft-ms", "30", "--itl-ms", "20", "--max-tokens", "24")
    with make_stack(
        services,
        migrated,
        logs,
        workers=CHAT_WORKERS,
        sim_args=sim,
        **UNLIMITED,  # type: ignore[arg-type]
    ) as stack:
        for i in range(CHAT_WORKERS):
            stack.wait_worker(f"chat{i}")
        stack.wait_ready()
        tally = Tally()
        chats = tally.chats
        stop_at = time.monotonic() + SOAK_S
        killer = asyncio.ensure_future(_kill_at_random(stack, stop_at, rng))
        sockets, readers = await _load(stack, tally, stop_at)
        killed = await killer
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tally.all_ended.wait(), DRAIN_S)
        for ws in sockets:
            await ws.close()
        for reader in readers:
            reader.cancel()

        hung = [cid for cid, c in chats.items() if c.end is None]
        assert not hung, f"{len(hung)} of {len(chats)} chats never ended: {hung[:10]}"
        broken = [cid for cid, c in chats.items() if c.seqs != list(range(len(c.seqs)))]
        assert not broken, f"chats with gaps or repeats in their seqs: {broken[:10]}"
        done = [c.job_id for c in chats.values() if c.end and c.end["type"] == "done"]
        assert all(done)
        errors = Counter(
            str(c.end["code"]) for c in chats.values() if c.end and c.end["type"] == "error"
        )
        rows = await _usage(stack, [j for j in done if j], timeout=90)
        missing = [j for j in done if j not in rows]
        doubled = {j: s for j, s in rows.items() if len(s) > 1}
        print(
            f"\nsoak: {len(chats)} chats, {len(done)} done, errors {dict(errors)}, kills "
            f"{killed}, rows {len(rows)}, missing {len(missing)}"
        )
        assert len(killed) >= 5, killed
        assert not missing, f"{len(missing)} done chats without a usage row: {missing[:10]}"
        assert not doubled, doubled
        assert all(s == ["ok"] for j, s in rows.items() if j in set(done)), rows
        # Failover answers the chats of a killed worker; an error is the exception.
        assert sum(errors.values()) <= 0.05 * len(chats), errors
