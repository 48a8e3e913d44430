"""The stack over several hosts (issue 33): two gateways behind HAProxy, two chat-worker hosts,
a bulk-worker host, Redis with a replica and three Sentinels (tests/cluster/bed.py).

The tests run in file order on one bed: the healthy bed first (load through HAProxy, rate
limits over both gateways, a revocation, the cache across worker hosts), then the losses (a
chat-worker host, a gateway host, the Redis primary), each checking that every client ends
with `done` or `error` and that every `done` chat has its one usage row; last, the database
host."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import websockets

from firsttoken.keyscli import create_key, revoke
from shared.settings import Settings, load_settings
from tests.cluster.bed import Bed
from tests.faults.test_durable import Chat, Chats, wait_rows

pytestmark = pytest.mark.timeout(240)


async def _socket(url: str, key: str) -> Any:
    return await websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"})


def _settings(bed: Bed) -> Settings:
    return load_settings(
        redis_url=bed.stack.services.redis_url,
        database_url=bed.stack.services.database_url,
        redis_prefix=bed.stack.prefix,
    )


async def _load(bed: Bed, sockets: int, per_socket: int, tag: str) -> list[Chats]:
    """`sockets` sockets through HAProxy, `per_socket` uncached chats each, read to the end."""
    opened = [await _socket(bed.ws_url, bed.stack.api_key) for _ in range(sockets)]
    try:
        runs = [Chats(ws) for ws in opened]
        for i, chats in enumerate(runs):
            await chats.start(per_socket, lambda _: 16, prefix=f"{tag}{i}-")
        await asyncio.gather(*(chats.read(Chats.all_ended, 60) for chats in runs))
        return runs
    finally:
        for ws in opened:
            await ws.close()


async def test_chats_through_haproxy_all_end_done_with_their_usage_rows(bed: Bed) -> None:
    """8 sockets through HAProxy (spread over both gateways), 3 chats each: all `done`, and
    each has its one usage row."""
    runs = await _load(bed, 8, 3, "load")
    ends: dict[str, int] = {}
    for chats in runs:
        for kind, n in chats.ends().items():
            ends[kind] = ends.get(kind, 0) + n
    assert ends == {"done": 24}, ends
    jobs = [c.job_id for chats in runs for c in chats.done()]
    await wait_rows(bed.stack.services.database_url, jobs, 60)


def _chat(chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "chat", "id": chat_id, "messages": [{"role": "user", "content": text}], **extra}


async def _first_frame(ws: Any, chat_id: str) -> dict[str, Any]:
    """The first frame of a chat: `accepted`, or the `error` that refused it."""
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
        if frame.get("id") == chat_id and frame["type"] in ("accepted", "error"):
            return dict(frame)


async def test_a_keys_rate_limit_is_exact_over_both_gateways(bed: Bed) -> None:
    """A key allowed 6 chats a minute, 12 tried alternately on gw1 and gw2 (past HAProxy):
    exactly 6 accepted, the other 6 refused `rate_limited`."""
    created = await create_key(_settings(bed), f"rl-{uuid.uuid4().hex[:6]}", rpm=6)
    sockets = [await _socket(bed.gateway_ws(g), created.key) for g in ("gw1", "gw2")]
    try:
        firsts = []
        for i in range(12):
            ws = sockets[i % 2]
            chat_id = f"rl{i}"
            await ws.send(json.dumps(_chat(chat_id, f"q {i}", max_tokens=2)))
            firsts.append(await _first_frame(ws, chat_id))
    finally:
        for ws in sockets:
            await ws.close()
    kinds = [f["type"] if f["type"] == "accepted" else f.get("code") for f in firsts]
    assert kinds.count("accepted") == 6 and kinds.count("rate_limited") == 6, kinds


async def _serves(url: str, key: str) -> bool:
    """Whether the gateway at `url` takes a chat with `key` (False: refused `unauthorized`)."""
    ws = await _socket(url, key)
    try:
        try:
            await ws.send(json.dumps(_chat("probe", "hello", max_tokens=1)))
        except websockets.ConnectionClosed as exc:
            # A revoked key's socket is closed by the gateway, 1008 unauthorized, perhaps
            # before the probe is sent.
            assert exc.rcvd is not None and exc.rcvd.code == 1008, exc
            return False
        while True:
            try:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
            except websockets.ConnectionClosed:
                return False
            if frame["type"] == "accepted":
                return True
            if frame["type"] == "error":
                assert frame.get("code") == "unauthorized", frame
                return False
    finally:
        await ws.close()


async def test_a_revocation_reaches_both_gateways(bed: Bed) -> None:
    """A key both gateways have served (and cached) is revoked once: within seconds neither
    gateway takes a chat with it."""
    settings = _settings(bed)
    created = await create_key(settings, f"rv-{uuid.uuid4().hex[:6]}")
    urls = [bed.gateway_ws(g) for g in ("gw1", "gw2")]
    assert [await _serves(url, created.key) for url in urls] == [True, True]
    assert await revoke(settings, created.key_id)
    deadline = asyncio.get_running_loop().time() + 10
    serving = urls
    while serving and asyncio.get_running_loop().time() < deadline:
        serving = [url for url in serving if await _serves(url, created.key)]
        if serving:
            await asyncio.sleep(0.2)
    assert not serving, f"still served after the revocation: {serving}"


def _cache_entries(bed: Bed) -> int:
    with bed.stack.redis() as client:
        return sum(
            int(client.zcard(k)) for k in client.scan_iter(f"{bed.stack.prefix}:cache:lru:*")
        )


async def _ask(bed: Bed, text: str, tag: str, **extra: Any) -> dict[str, Any]:
    """One chat through HAProxy on a fresh socket; its last frame. (A whole answer: one cut
    at max_tokens is not cached.)"""
    ws = await _socket(bed.ws_url, bed.stack.api_key)
    try:
        chats = Chats(ws)
        chats.chats[tag] = Chat()
        await ws.send(json.dumps(_chat(tag, text, temperature=0, **extra)))
        await chats.read(Chats.all_ended, 30)
        end = chats.chats[tag].end
        assert end is not None
        return end
    finally:
        await ws.close()


async def test_a_chat_worker_host_lost_its_chats_end_and_its_cached_answer_is_served_by_the_other(
    bed: Bed,
) -> None:
    """An answer cached while only chat1 serves; then chat2 back and chat1's host killed with 6
    chats streaming: each of them ends `done` or `error` (`done` ones billed), and the same
    question, now answered by chat2's host alone, comes from the cache chat1 wrote."""
    question = f"What is the warranty on model {uuid.uuid4().hex[:6]}?"
    bed.kill_host("chat2")
    before = _cache_entries(bed)
    first = await _ask(bed, question, "seed")
    assert first["type"] == "done" and first["cached"] is False, first
    deadline = asyncio.get_running_loop().time() + 15
    while _cache_entries(bed) <= before:  # written after `done`, off the chat's path
        assert asyncio.get_running_loop().time() < deadline, "the answer was never cached"
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # the other workers' indexes follow within 1 s
    await asyncio.to_thread(bed.start_chat_host, "chat2")
    ws = await _socket(bed.ws_url, bed.stack.api_key)
    try:
        chats = Chats(ws)
        await chats.start(6, lambda _: 48, prefix="lost")
        await chats.read(Chats.all_streaming, 30)
        bed.kill_host("chat1")
        await chats.read(Chats.all_ended, 60)
    finally:
        await ws.close()
    assert set(chats.ends()) <= {"done", "engine_error", "overloaded", "timeout"}, chats.ends()
    again = await _ask(bed, question, "again")
    assert again["type"] == "done" and again["cached"] is True, again
    await wait_rows(bed.stack.services.database_url, [c.job_id for c in chats.done()], 60)


class Follower:
    """One chat on a socket through HAProxy that resumes on a new socket when its gateway
    goes: every seq it saw, in order, across sockets."""

    def __init__(self, bed: Bed, chat_id: str) -> None:
        self.bed = bed
        self.chat_id = chat_id
        self.job_id = ""
        self.seqs: list[int] = []
        self.end: dict[str, Any] | None = None
        self.resumed = 0
        self.ws: Any = None

    async def start(self, max_tokens: int) -> None:
        self.ws = await _socket(self.bed.ws_url, self.bed.stack.api_key)
        text = f"tell me a long story {self.chat_id}"
        await self.ws.send(
            json.dumps(_chat(self.chat_id, text, max_tokens=max_tokens, cache=False))
        )

    async def read(self, until: Any, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not until(self):
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"{self.chat_id}: seqs {self.seqs[-3:]}, end {self.end}"
            try:
                frame = json.loads(await asyncio.wait_for(self.ws.recv(), left))
            except websockets.ConnectionClosed:
                await self._resume()
                continue
            if frame.get("id") != self.chat_id:
                continue
            if frame["type"] == "accepted":
                self.job_id = frame["job_id"]
            elif frame["type"] == "token":
                self.seqs.append(int(frame["seq"]))
            elif frame["type"] in ("done", "error"):
                self.end = frame

    async def _resume(self) -> None:
        """Its gateway is gone: a new socket through HAProxy, and `resume` after the last
        seq seen (HAProxy sends the connection to the gateway that is left)."""
        self.resumed += 1
        self.ws = await _socket(self.bed.ws_url, self.bed.stack.api_key)
        after = self.seqs[-1] if self.seqs else -1
        await self.ws.send(json.dumps({"type": "resume", "id": self.chat_id,
                                       "job_id": self.job_id, "after_seq": after}))  # fmt: skip

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def test_a_gateway_host_lost_its_clients_resume_through_haproxy_on_the_other(
    bed: Bed,
) -> None:
    """8 chats streaming through HAProxy (spread over both gateways), gw1's host killed: the
    clients it held reconnect through HAProxy and resume on gw2; every chat ends `done` with
    every seq once, in order, and has its one usage row."""
    followers = [Follower(bed, f"gwl{i}") for i in range(8)]
    try:
        for f in followers:
            await f.start(48)
        await asyncio.gather(*(f.read(lambda f: len(f.seqs) >= 3, 30) for f in followers))
        bed.kill_host("gw1")
        await asyncio.gather(*(f.read(lambda f: f.end is not None, 60) for f in followers))
    finally:
        for f in followers:
            await f.close()
    resumed = [f.chat_id for f in followers if f.resumed]
    assert resumed, "no client was on the killed gateway (HAProxy balances round robin)"
    ends = [(f.chat_id, f.end and f.end["type"]) for f in followers]
    assert all(end == "done" for _, end in ends), ends
    broken = [f.chat_id for f in followers if f.seqs != list(range(len(f.seqs)))]
    assert not broken, broken
    await wait_rows(bed.stack.services.database_url, [f.job_id for f in followers], 60)
    print(f"\ngateway host lost: {len(resumed)} of 8 clients resumed on the other, all done")


async def test_the_redis_primary_lost_chats_end_and_new_ones_succeed_within_10s(
    bed: Bed,
) -> None:
    """The Redis primary killed with 6 chats streaming through HAProxy: each ends `done` or a
    clear error, a new chat succeeds within 10 s of the Sentinels' promotion, and every `done`
    chat has its one usage row."""
    ws = await _socket(bed.ws_url, bed.stack.api_key)
    try:
        chats = Chats(ws)
        await chats.start(6, lambda _: 48, prefix="rf")
        await chats.read(Chats.all_streaming, 30)
        await asyncio.to_thread(bed.group.failover)
        promoted = asyncio.get_running_loop().time()
        tries: list[dict[str, Any]] = []
        while not tries or tries[-1]["type"] != "done":
            assert asyncio.get_running_loop().time() - promoted < 10, tries
            try:
                n = len(tries)
                tries.append(await _ask(bed, f"after the failover {n}", f"n{n}", max_tokens=8))
            except (OSError, websockets.WebSocketException) as exc:
                tries.append({"type": "refused", "why": repr(exc)})
            if tries[-1]["type"] != "done":
                await asyncio.sleep(0.2)
        back = asyncio.get_running_loop().time() - promoted
        await chats.read(Chats.all_ended, 60)
    finally:
        await ws.close()
    assert set(chats.ends()) <= {"done", "engine_error", "overloaded", "timeout"}, chats.ends()
    await wait_rows(bed.stack.services.database_url, [c.job_id for c in chats.done()], 60)
    print(f"\nredis primary lost: in flight {chats.ends()}, a new chat done {back:.1f}s after")


async def test_the_database_host_lost_chats_go_on_and_their_rows_land_once_it_is_back(
    bed: Bed,
) -> None:
    """PostgreSQL unreachable (its forward refusing connections): chats with a key already
    known go on and end `done`; their usage rows land, once each, when it is back."""
    bed.db_proxy.down("refuse")
    try:
        runs = await _load(bed, 2, 3, "pg")
    finally:
        bed.db_proxy.up()
    ends = [chats.ends() for chats in runs]
    assert all(e == {"done": 3} for e in ends), ends
    jobs = [c.job_id for chats in runs for c in chats.done()]
    await wait_rows(bed.stack.services.database_url, jobs, 60)
