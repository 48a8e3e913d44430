"""Nothing billed is lost, Redis restarts are ridden out, a dead gateway's work stops (issue 29).

Real processes killed with SIGKILL, a redis-server of the test's own stopped and started again
on its port, PostgreSQL behind a proxy taken down: every chat that got `done` has exactly one
usage row, chats streaming through a Redis restart finish, and a killed gateway's engine
requests and stream slots are given back within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from sqlalchemy import make_url, text

from firsttoken.procs import gateway_args
from shared.db.session import make_engine
from shared.keys import BULK_QUEUE, Keys
from tests.integration.conftest import Services, Stack, make_stack
from tests.integration.test_persist_outage import TcpProxy
from tests.support import (
    free_port,
    port_open,
    throwaway_redis_server,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)

CHATS = 20


@dataclass
class Chat:
    """One chat's frames as one socket saw them."""

    job_id: str = ""
    seqs: list[int] = field(default_factory=list)
    end: dict[str, Any] | None = None
    ended_at: float = 0.0


class Chats:
    """Many chats on one socket, read by one task."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.chats: dict[str, Chat] = {}

    async def start(self, n: int, max_tokens: Any, prefix: str = "c") -> None:
        for i in range(n):
            chat_id = f"{prefix}{i}"
            self.chats[chat_id] = Chat()
            frame = {
                "type": "chat",
                "id": chat_id,
                "messages": [{"role": "user", "content": f"question {prefix} {i}"}],
                "max_tokens": max_tokens(i),
                "cache": False,
            }
            await self.ws.send(json.dumps(frame))

    async def read(self, until: Any, timeout: float) -> None:
        """Read frames until `until(self)` holds."""
        deadline = time.monotonic() + timeout
        while not until(self):
            left = deadline - time.monotonic()
            assert left > 0, f"gave up waiting; ends: {self.ends()}"
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), left))
            chat = self.chats.get(frame.get("id"))
            if chat is None:
                continue
            kind = frame["type"]
            if kind == "accepted":
                chat.job_id = frame["job_id"]
            elif kind == "token":
                chat.seqs.append(int(frame["seq"]))
            elif kind in ("done", "error"):
                chat.end, chat.ended_at = frame, time.monotonic()

    async def drain(self, seconds: float) -> None:
        """Read whatever arrives for `seconds` (so what comes later is new)."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + seconds):
                await self.read(lambda _: time.monotonic() >= deadline, seconds + 1)

    def ends(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for chat in self.chats.values():
            kind = "open" if chat.end is None else chat.end.get("code", chat.end["type"])
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def done(self) -> list[Chat]:
        return [c for c in self.chats.values() if c.end is not None and c.end["type"] == "done"]

    def all_ended(self) -> bool:
        return all(c.end is not None for c in self.chats.values())

    def all_streaming(self) -> bool:
        return all(c.seqs for c in self.chats.values())


async def _open(stack: Stack, url: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    return await websockets.connect(url or stack.ws_url, additional_headers=headers)


def usage_rows(database_url: str, job_ids: list[str]) -> tuple[int, int]:
    """(usage rows, distinct request ids) of these jobs."""

    async def _count() -> tuple[int, int]:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as conn:
                row = (
                    await conn.execute(
                        text(
                            "SELECT count(*), count(DISTINCT request_id) FROM usage_events"
                            " WHERE request_id = ANY(:ids)"
                        ),
                        {"ids": job_ids},
                    )
                ).one()
            return int(row[0]), int(row[1])
        finally:
            await engine.dispose()

    return asyncio.run(_count())


async def wait_rows(database_url: str, job_ids: list[str], timeout: float) -> float:
    """Wait until every job has its usage row; returns the seconds waited. Fails on a
    duplicate."""
    started = time.monotonic()
    while True:
        rows, distinct = await asyncio.to_thread(usage_rows, database_url, job_ids)
        assert rows == distinct, f"{rows - distinct} duplicate usage rows"
        if distinct == len(job_ids):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{distinct} of {len(job_ids)} rows"
        await asyncio.sleep(0.5)


def _needs_postgres(services: Services) -> None:
    if make_url(services.database_url).get_backend_name() != "postgresql":
        pytest.skip("counts usage rows in PostgreSQL (FIRSTTOKEN_TEST_POSTGRES_URL)")


def _contiguous(chat: Chat) -> bool:
    return chat.seqs == list(range(len(chat.seqs)))


async def test_chat_worker_killed_every_done_chat_has_its_usage_row(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """SIGKILL of the chat worker right after the first chats finish, inside the usage batch
    window: every chat that got `done` gets its usage row (a bulk worker sends on the rows
    the dead worker left in Redis), none twice."""
    _needs_postgres(services)
    sim = ("--ttft-ms", "20", "--itl-ms", "20", "--max-tokens", "400")
    with make_stack(services, migrated, tmp_path, sim_args=sim) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        try:
            chats = Chats(ws)
            await chats.start(CHATS, lambda i: 4 + 8 * i)
            await chats.read(lambda c: len(c.done()) >= 6, 30)
            stack.procs["chat0"].kill()
            killed_at = time.monotonic()
            done = chats.done()
            recent = [c for c in done if killed_at - c.ended_at < 0.25]
            await chats.read(Chats.all_ended, 30)
        finally:
            await ws.close()
        waited = await wait_rows(stack.services.database_url, [c.job_id for c in done], 60)
        print(
            f"\nworker kill: {len(done)} done before the kill ({len(recent)} within 250 ms "
            f"of it), all rows {waited:.1f}s after; ends {chats.ends()}"
        )
        assert done and len(chats.done()) == len(done)


async def test_bulk_tasks_lost_on_the_way_are_sent_again_and_their_rows_land_once(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """The bulk tasks of 10 done chats vanish from the queue before any bulk worker ran them
    (as when kombu takes a message off the list and its worker is killed before it records it
    as unacked): their rows wait in the usage outbox, a bulk worker's sweep queues them again
    once due, each lands once, and the outbox is empty after."""
    _needs_postgres(services)
    quick = {
        "bulk_visibility_timeout_s": "5",
        "persist_retry_backoff_max_s": "2",
        "usage_resend_after_s": "6",
    }
    with make_stack(services, migrated, tmp_path, bulk=False, **quick) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        try:
            chats = Chats(ws)
            await chats.start(10, lambda i: 4)
            await chats.read(Chats.all_ended, 30)
        finally:
            await ws.close()
        assert chats.ends() == {"done": 10}, chats.ends()
        keys = Keys(stack.prefix)
        with stack.redis() as admin:
            wait_until(lambda: admin.llen(keys.queue_list(BULK_QUEUE)) > 0, 10, what="tasks")
            admin.delete(keys.queue_list(BULK_QUEUE))  # lost on the way
            assert admin.hlen(keys.usage_rows) == 10
        stack.start_worker("bulk", "bulk")
        jobs = [c.job_id for c in chats.done()]
        waited = await wait_rows(stack.services.database_url, jobs, 30)
        print(f"\nlost bulk tasks: all {len(jobs)} rows {waited:.1f}s after a bulk worker started")
        with stack.redis() as admin:
            wait_until(lambda: admin.hlen(keys.usage_rows) == 0, 10, what="the outbox emptied")
            assert admin.zcard(keys.usage_due) == 0


REDIS_AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[tuple[int, list[Any]]]:
    """A redis-server with an append-only file (a restart keeps its data, as a production one
    configured for it does): (port, [the running process]), restarted at will."""
    port = free_port()
    procs = [throwaway_redis_server(port, tmp_path, *REDIS_AOF)]
    try:
        yield port, procs
    finally:
        procs[-1].terminate()
        procs[-1].wait(10)


@pytest.mark.parametrize("outage_s", [3, 10])
async def test_redis_restart_in_flight_chats_finish_and_are_billed(
    services: Services,
    migrated: str,
    tmp_path: Path,
    persistent_redis: tuple[int, list[Any]],
    outage_s: int,
) -> None:
    """The whole stack's Redis stopped for 3 s (10 s) with 20 chats streaming and started again
    on its port: every chat finishes with `done`, its seqs contiguous, and has its usage row."""
    _needs_postgres(services)
    port, procs = persistent_redis
    on_own = Services(f"redis://127.0.0.1:{port}/0", services.database_url, [])
    # Longer than the outage: every chat is still generating when Redis goes.
    sim = ("--ttft-ms", "20", "--itl-ms", "25", "--max-tokens", "1000")
    tokens = int((outage_s + 4) / 0.025)
    with make_stack(on_own, migrated, tmp_path, sim_args=sim) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        try:
            chats = Chats(ws)
            await chats.start(CHATS, lambda i: tokens + i)
            await chats.read(Chats.all_streaming, 20)
            procs[-1].terminate()
            procs[-1].wait(10)
            await chats.drain(outage_s)  # what was relayed before the stop
            seen = {chat_id: len(c.seqs) for chat_id, c in chats.chats.items()}
            procs.append(throwaway_redis_server(port, tmp_path, *REDIS_AOF))
            back_at = time.monotonic()

            def all_moving(cs: Chats) -> bool:
                return all(len(c.seqs) > seen[i] or c.end for i, c in cs.chats.items())

            await chats.read(all_moving, 30)
            moving = time.monotonic() - back_at
            await chats.read(Chats.all_ended, 60)
        finally:
            await ws.close()
        ends = chats.ends()
        errors = [c.end for c in chats.chats.values() if c.end and c.end["type"] == "error"]
        assert ends == {"done": CHATS}, (ends, errors)
        broken = [i for i, c in chats.chats.items() if not _contiguous(c)]
        assert not broken, broken
        last = max(c.ended_at for c in chats.chats.values()) - back_at
        waited = await wait_rows(stack.services.database_url, [c.job_id for c in chats.done()], 60)
        print(
            f"\nredis down {outage_s}s: every chat streaming again {moving:.1f}s after Redis "
            f"was back, {CHATS}/{CHATS} done (the last {last:.1f}s after); rows {waited:.1f}s "
            "after the last done"
        )


def _slots_held(stack: Stack) -> int:
    with stack.redis() as admin:
        return sum(int(admin.zcard(k)) for k in admin.scan_iter(f"{stack.prefix}:streams:*"))


async def test_gateway_killed_its_engine_requests_stop_and_its_slots_come_back(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """SIGKILL of a gateway with chats streaming: their engine requests are aborted within
    3 s and the key's stream slots are free within 5 s (a chat through another gateway is
    admitted); a chat the other gateway follows too (a resume) runs on to its `done`."""
    streams = 4
    sim = ("--ttft-ms", "20", "--itl-ms", "50", "--max-tokens", "1000")
    with make_stack(
        services, migrated, tmp_path, bulk=False, sim_args=sim, key_max_streams_default=str(streams)
    ) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        port = free_port()
        stack.start("gateway-b", gateway_args(port)["gateway"])
        wait_until(lambda: port_open(port), 20, what="gateway-b")
        other_url = stack.ws_url.replace(str(stack.gateway_port), str(port))

        doomed = await _open(stack)
        chats = Chats(doomed)
        # One of them short enough to end while the test watches, followed from gateway-b.
        await chats.start(streams, lambda i: 80 if i == 0 else 600)
        await chats.read(Chats.all_streaming, 20)
        survivor_ws = await _open(stack, other_url)
        try:
            survivor = Chats(survivor_ws)
            survivor.chats["r"] = Chat()
            resume = {"type": "resume", "id": "r", "job_id": chats.chats["c0"].job_id}
            await survivor_ws.send(json.dumps({**resume, "after_seq": -1}))
            await survivor.read(lambda s: len(s.chats["r"].seqs) > 0, 10)

            aborted_before = stack.sim_metric("firsttoken_sim_requests_aborted_total")
            stack.procs["gateway"].kill()
            killed_at, killed_wall = time.monotonic(), time.time()

            # The slots: a new chat on the same key through gateway-b is admitted.
            slot_back_at = None
            for attempt in range(60):
                chat_id = f"p{attempt}"
                survivor.chats[chat_id] = Chat()
                frame = {
                    "type": "chat",
                    "id": chat_id,
                    "messages": [{"role": "user", "content": "again"}],
                    "max_tokens": 2,
                    "cache": False,
                }
                await survivor_ws.send(json.dumps(frame))
                await survivor.read(lambda s, c=chat_id: s.chats[c].end is not None, 15)
                end = survivor.chats[chat_id].end
                assert end is not None
                if end["type"] == "done":
                    slot_back_at = time.monotonic() - killed_at
                    break
                assert end["code"] == "rate_limited", end
                await asyncio.sleep(0.2)
            assert slot_back_at is not None and slot_back_at < 5.5, slot_back_at

            def all_aborted() -> bool:
                aborted = stack.sim_metric("firsttoken_sim_requests_aborted_total")
                return aborted - aborted_before >= streams - 1

            wait_until(all_aborted, 10, what="the dead gateway's engine requests aborted")
            last_abort = stack.sim_metric("firsttoken_sim_last_abort_timestamp_seconds")
            abort_after = last_abort - killed_wall
            await survivor.read(lambda s: s.chats["r"].end is not None, 30)
            resumed_end = survivor.chats["r"].end
        finally:
            await survivor_ws.close()
        print(
            f"\ngateway kill: {streams - 1} engine requests aborted {abort_after:.2f}s after, "
            f"a slot admitted again {slot_back_at:.2f}s after; resumed chat: "
            f"{resumed_end and resumed_end['type']}"
        )
        assert abort_after < 3.5, abort_after
        assert resumed_end is not None and resumed_end["type"] == "done", resumed_end


async def test_a_gateway_stopped_as_its_chats_end_leaves_no_stream_slot_held(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """A gateway frozen (then killed) right after admitting short chats never relays their
    ends nor frees their stream slots: the worker that ran them frees each slot as the chat
    ends, long before the 60 s lease, so the key's slots are all free within 5 s."""
    sim = ("--ttft-ms", "20", "--itl-ms", "20", "--max-tokens", "1000")
    with make_stack(
        services, migrated, tmp_path, bulk=False, sim_args=sim, key_max_streams_default="4"
    ) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        chats = Chats(ws)
        await chats.start(3, lambda i: 10)
        await chats.read(Chats.all_streaming, 20)
        stack.procs["gateway"].popen.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            with stack.redis() as admin:

                def held() -> int:
                    streams = admin.scan_iter(Keys(stack.prefix).key_streams("*"))
                    return sum(int(admin.zcard(key)) for key in streams)

                assert held() > 0
                wait_until(lambda: held() == 0, 5, what="the stream slots freed")
                freed_after = time.monotonic() - stopped_at
        finally:
            stack.procs["gateway"].kill()
        print(f"\ngateway stopped as its chats ended: slots free {freed_after:.2f}s after")


async def test_bulk_worker_killed_while_the_database_is_down_rows_land_once_within_60s(
    services: Services,
    migrated: str,
    tmp_path: Path,
    proxied_database: tuple[str, TcpProxy],
) -> None:
    """The database down, 20 chats answered, the bulk worker holding their rows' tasks killed;
    the database back and a new bulk worker: every row lands within 60 s, none twice (the
    broker redelivers a dead worker's unacked tasks after its visibility timeout)."""
    database_url, proxy = proxied_database
    on_proxy = Services(services.redis_url, database_url, [])
    with make_stack(on_proxy, migrated, tmp_path) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        ws = await _open(stack)
        try:
            chats = Chats(ws)
            await chats.start(1, lambda i: 4, prefix="warm")
            await chats.read(Chats.all_ended, 20)  # the key is cached: auth needs no database
            # "drop" (connections accepted and closed), not "refuse": a closed listener's port
            # may be taken by an outgoing connection meanwhile, and the proxy could not reopen.
            proxy.down("drop")
            chats = Chats(ws)
            await chats.start(CHATS, lambda i: 4 + i)
            await chats.read(Chats.all_ended, 30)
        finally:
            await ws.close()
        assert chats.ends() == {"done": CHATS}, chats.ends()
        queue = Keys(stack.prefix).queue_list(BULK_QUEUE)
        with stack.redis() as admin:
            # The bulk worker has taken the tasks (they wait on it, retrying).
            wait_until(lambda: admin.llen(queue) == 0, 20, what="the bulk queue drained")
            unacked = f"{Keys(stack.prefix).celery_keyprefix}unacked"
            # Some held by the worker, unacked (the rest wait in the queue for their countdown).
            wait_until(lambda: admin.hlen(unacked) > 0, 20, what="tasks held unacked")
            held = int(admin.hlen(unacked))
        stack.procs["bulk"].kill()
        proxy.up()
        back_at = time.monotonic()
        stack.start_worker("bulk2", "bulk")
        jobs = [c.job_id for c in chats.done()]
        waited = await wait_rows(stack.services.database_url, jobs, 70)
        print(
            f"\nbulk kill, database down: {held} tasks unacked at the kill; {len(jobs)} rows "
            f"{waited:.1f}s after the database was back"
        )
        assert time.monotonic() - back_at < 60
