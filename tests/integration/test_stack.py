"""End to end through the real gateway, Celery workers, Redis and database."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest
import websockets
from sqlalchemy import select

from shared.db.models import UsageEvent
from shared.db.session import make_engine, make_sessionmaker
from shared.keys import CHAT_QUEUE, CHAT_TASK, Keys
from shared.tasks import ChatJob, new_id, task_message
from tests.integration.conftest import Client, Stack, celery_chat_worker, make_stack

pytestmark = pytest.mark.integration


async def _usage(database_url: str, request_id: str, timeout: float = 15.0) -> list[UsageEvent]:
    engine = make_engine(database_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            async with make_sessionmaker(engine)() as session:
                rows = list(
                    (
                        await session.execute(
                            select(UsageEvent).where(UsageEvent.request_id == request_id)
                        )
                    ).scalars()
                )
            if rows or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.2)
    finally:
        await engine.dispose()


async def test_chat_streams_tokens_in_order_and_done_reports_usage_and_timings(
    connect: Any,
) -> None:
    """A chat gets `accepted`, tokens with seq 0..n-1, and a complete `done` frame."""
    client = await connect()
    await client.chat("c1", "what is firsttoken?")
    accepted = await client.next_for("c1")
    assert accepted["type"] == "accepted" and accepted["job_id"]
    tokens, done = await client.until_end("c1")
    assert done["type"] == "done", done
    assert [t["seq"] for t in tokens] == list(range(len(tokens))) and tokens
    assert done["cached"] is False and done["model"] == "sim"
    assert done["finish_reason"] in ("stop", "length")
    assert done["usage"]["completion_tokens"] > 0 and done["usage"]["prompt_tokens"] > 0
    for name in ("queue_ms", "ttft_ms", "total_ms", "engine_ttft_ms", "cache_ms", "relay_ms"):
        assert name in done["timings"], name
    assert done["timings"]["ttft_ms"] <= done["timings"]["total_ms"]


async def test_same_question_gives_same_answer(connect: Any) -> None:
    """The simulated engine is deterministic, through the whole stack."""
    client = await connect()
    texts = []
    for chat_id in ("a", "b"):
        await client.chat(chat_id, "repeat me", max_tokens=16)
        tokens, done = await client.until_end(chat_id)
        assert done["type"] == "done"
        texts.append("".join(t["text"] for t in tokens))
    assert texts[0] == texts[1] and texts[0]


async def test_one_connection_runs_several_chats_at_once(connect: Any) -> None:
    """Chats on one socket are told apart by id and each completes in order."""
    client = await connect()
    ids = [f"m{i}" for i in range(5)]
    for chat_id in ids:
        await client.chat(chat_id, f"question {chat_id}")
    for chat_id in ids:
        tokens, done = await client.until_end(chat_id)
        assert done["type"] == "done", done
        assert [t["seq"] for t in tokens] == list(range(len(tokens)))


async def test_a_client_that_stops_reading_gets_every_frame_later_in_order(
    connect: Any, stack: Stack
) -> None:
    """A client that stops reading: the gateway's sends to it wait (flow control) and the
    frames after them queue in order; a chat on another connection is not held up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", stack.gateway_port))
    sock.setblocking(False)
    slow = await connect(sock=sock, max_queue=1)
    # ~6 MB of pongs: past the socket buffers (up to 4 MB here) and the transport's limit.
    count, pad = 40_000, "x" * 120
    for i in range(count):
        await slow.send({"type": "ping", "id": f"{pad}{i}"})
    fast = await connect()
    await fast.chat("fast", "not held up by the slow reader")
    _, done = await fast.until_end("fast")
    assert done["type"] == "done", done
    got = []
    while len(got) < count:
        frame = json.loads(await asyncio.wait_for(slow.ws.recv(), 20))
        got.append(frame["id"])
    assert got == [f"{pad}{i}" for i in range(count)]


@pytest.mark.parametrize(
    ("frame", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "JSON object"),
        ('{"type": "launch", "id": "x"}', "unknown frame type"),
        ('{"type": "chat", "id": "x"}', "messages"),
        ('{"type": "chat", "id": "x", "messages": "hi"}', "messages"),
        ('{"type": "chat", "id": "x", "messages": [{"role": "user", "content": 5}]}', "content"),
        (
            '{"type": "chat", "id": "x", "messages": [{"role": "user", "content": "a"}], '
            '"max_tokens": "many"}',
            "max_tokens",
        ),
        (
            '{"type": "chat", "id": "x", "messages": [{"role": "user", "content": "a"}], '
            '"max_tokens": 999999}',
            "max_tokens",
        ),
        ('{"type": "cancel"}', "id"),
    ],
)
async def test_bad_frames_get_invalid_request_and_the_connection_stays_usable(
    connect: Any, frame: str, needle: str
) -> None:
    """Each malformed frame gets `invalid_request` naming the problem; a chat still works after."""
    client = await connect()
    await client.chat("live", "a chat running alongside")
    await client.send(frame)
    error = None
    deadline = time.monotonic() + 10
    while error is None and time.monotonic() < deadline:
        for key in list(client.frames):
            for f in client.frames[key]:
                if f["type"] == "error":
                    error = f
        if error is None:
            raw = await asyncio.wait_for(client.ws.recv(), 10)
            f = json.loads(raw)
            client.frames.setdefault(f.get("id"), []).append(f)
    assert error is not None and error["code"] == "invalid_request", error
    assert needle in error["message"], error["message"]
    client.frames = {k: [f for f in v if f["type"] != "error"] for k, v in client.frames.items()}
    _, done = await client.until_end("live")
    assert done["type"] == "done"


async def test_oversize_frame_and_too_many_messages_are_refused(connect: Any) -> None:
    """Frames over max_frame_bytes or with too many messages get `invalid_request`."""
    client = await connect()
    await client.chat("big", "x" * (70 * 1024))
    err = await client.next_for(None)
    assert err["code"] == "invalid_request" and "limit" in err["message"]
    many = [{"role": "user", "content": "hi"}] * 17
    await client.send({"type": "chat", "id": "many", "messages": many})
    err = await client.next_for("many")
    assert err["code"] == "invalid_request" and "too many messages" in err["message"]
    await client.send({"type": "ping", "id": "p"})
    assert (await client.next_for("p"))["type"] == "pong"


async def test_missing_or_wrong_key_is_refused_before_anything_is_enqueued(stack: Stack) -> None:
    """No key or a wrong key: `unauthorized`, connection closed, nothing enqueued."""
    r = stack.redis()
    queue = Keys(stack.prefix).queue_list(CHAT_QUEUE)
    before = r.llen(queue)
    for headers in ({}, {"Authorization": "Bearer ft-wrong-key-123456"}):
        async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert frame["type"] == "error" and frame["code"] == "unauthorized"
            with pytest.raises(websockets.ConnectionClosed):
                await ws.send(
                    json.dumps(
                        {"type": "chat", "id": "x", "messages": [{"role": "user", "content": "hi"}]}
                    )
                )
                await asyncio.wait_for(ws.recv(), 5)
    assert r.llen(queue) == before


async def test_api_key_in_query_parameter(stack: Stack) -> None:
    """The key may also come as the api_key query parameter."""
    async with websockets.connect(f"{stack.ws_url}?api_key={stack.api_key}") as ws:
        await ws.send(json.dumps({"type": "ping", "id": "q"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "pong"


async def test_cancel_stops_the_job_and_writes_a_cancelled_usage_row(
    connect: Any, stack: Stack
) -> None:
    """A cancel frame ends the chat with `cancelled`; the engine sees an abort; usage says so."""
    aborted = stack.sim_metric("firsttoken_sim_requests_aborted_total")
    client = await connect()
    await client.chat("long", "a long answer please", max_tokens=32)
    job_id = (await client.next_for("long"))["job_id"]
    await client.next_for("long")  # first token: the engine is generating
    await client.send({"type": "cancel", "id": "long"})
    _, end = await client.until_end("long")
    assert end["type"] == "error" and end["code"] == "cancelled"
    wait = time.monotonic() + 5
    while stack.sim_metric("firsttoken_sim_requests_aborted_total") <= aborted:
        assert time.monotonic() < wait, "the engine never saw the abort"
        await asyncio.sleep(0.05)
    rows = await _usage(stack.services.database_url, job_id)
    assert len(rows) == 1 and rows[0].finish_reason == "cancelled"


async def test_client_disconnect_aborts_the_engine_request(connect: Any, stack: Stack) -> None:
    """Closing the socket mid-stream cancels the job; the engine's abort counter moves."""
    aborted = stack.sim_metric("firsttoken_sim_requests_aborted_total")
    client = await connect()
    await client.chat("bye", "stream then vanish", max_tokens=32)
    await client.next_for("bye")
    await client.next_for("bye")
    await client.ws.close()
    wait = time.monotonic() + 5
    while stack.sim_metric("firsttoken_sim_requests_aborted_total") <= aborted:
        assert time.monotonic() < wait, "the engine never saw the abort"
        await asyncio.sleep(0.05)
    wait = time.monotonic() + 5
    while stack.sim_metric("firsttoken_sim_requests_running") != 0:
        assert time.monotonic() < wait
        await asyncio.sleep(0.05)


async def test_usage_row_lands_once_per_request(connect: Any, stack: Stack) -> None:
    """A finished chat writes exactly one usage row with its token counts, the frame's user
    and tags, and its cache tier; the sim model has no prices, so its cost is NULL."""
    client = await connect()
    await client.chat("u1", "count my tokens", user="end-7", tags={"team": "qa"})
    job_id = (await client.next_for("u1"))["job_id"]
    _, done = await client.until_end("u1")
    rows = await _usage(stack.services.database_url, job_id)
    assert len(rows) == 1
    assert rows[0].completion_tokens == done["usage"]["completion_tokens"]
    assert rows[0].status == "ok"
    assert (rows[0].end_user, rows[0].tags) == ("end-7", {"team": "qa"})
    assert rows[0].cache_tier in ("miss", "off") and rows[0].cost is None
    assert rows[0].cached_prompt_tokens is None  # the simulator reports none


async def test_resume_replays_from_the_log_for_the_same_key_only(
    connect: Any, stack: Stack, migrated: str
) -> None:
    """`resume` replays the tokens after after_seq and the done frame; another key is refused."""
    client = await connect()
    await client.chat("r", "resume me", max_tokens=16)
    job_id = (await client.next_for("r"))["job_id"]
    tokens, done = await client.until_end("r")
    again = await connect()
    await again.send({"type": "resume", "id": "r2", "job_id": job_id, "after_seq": 2})
    assert (await again.next_for("r2"))["type"] == "accepted"
    replayed, done2 = await again.until_end("r2")
    assert [t["seq"] for t in replayed] == [t["seq"] for t in tokens[3:]]
    assert done2["type"] == "done" and done2["usage"] == done["usage"]
    await again.send({"type": "resume", "id": "r3", "job_id": new_id(), "after_seq": -1})
    assert (await again.next_for("r3"))["code"] == "invalid_request"


def test_health_ready_and_metrics(stack: Stack) -> None:
    """/healthz answers, /readyz names its checks and is ready, /metrics is Prometheus text."""
    assert stack.get("/healthz")[0] == 200
    code, body = stack.get("/readyz")
    ready = json.loads(body)
    assert code == 200 and set(ready["checks"]) == {"redis", "database", "chat_workers"}
    code, text = stack.get("/metrics")
    assert code == 200 and "firsttoken_gateway_chats_total" in text


def _enqueue_directly(
    stack: Stack,
    content: str,
    *,
    age_s: float,
    deadline_in_s: float,
    cancelled: bool = False,
    model: str | None = None,
    until: str = "E",
    job_id: str | None = None,
) -> list[str]:
    """Put a chat job on the queue as a gateway would (received `age_s` ago, its deadline
    `deadline_in_s` from now; with `cancelled`, its cancel flag set as the gateway sets it when
    the client cancels a queued chat) and return its channel's messages up to the first of kind
    `until` (at most 10 s)."""
    keys = Keys(stack.prefix)
    r = stack.redis()
    job_id = job_id or new_id()
    if cancelled:
        r.set(keys.cancel_flag(job_id), "1", ex=60)
    pubsub = r.pubsub()
    pubsub.subscribe(keys.job_channel(job_id))
    now = time.time()
    job = ChatJob(
        job_id=job_id,
        chat_id="direct",
        tenant_id="t",
        key_id="k",
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        model=model,
        max_tokens=8,
        received_at=now - age_s,
        enqueued_at=now - age_s,
        deadline_at=now + deadline_in_s,
    )
    r.lpush(
        keys.queue_list(CHAT_QUEUE),
        task_message(CHAT_TASK, {"job": job.model_dump()}, queue=CHAT_QUEUE, task_id=job_id),
    )
    messages: list[str] = []
    deadline = time.monotonic() + 10
    while not any(m.startswith(until) for m in messages) and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=0.5)
        if m and m["type"] == "message":
            messages.append(m["data"])
    pubsub.close()
    return messages


def test_a_job_past_its_queue_deadline_is_dropped_not_run(stack: Stack) -> None:
    """A chat task that waited past its deadline gets `timeout` and never reaches the engine."""
    started = stack.sim_metric("firsttoken_sim_requests_started_total")
    messages = _enqueue_directly(stack, "too late", age_s=20, deadline_in_s=-10)
    assert len(messages) == 1 and messages[0].startswith("E\n")
    assert json.loads(messages[0].split("\n", 1)[1])["code"] == "timeout"
    assert stack.sim_metric("firsttoken_sim_requests_started_total") == started


def test_a_job_cancelled_while_queued_streams_nothing_and_leaves_no_engine_request(
    stack: Stack,
) -> None:
    """The client cancelled while the job waited in the queue (the gateway set its cancel
    flag): the worker sends no token, ends the job `cancelled`, and the engine is left with
    no request running (one sent meanwhile is aborted)."""
    finished = stack.sim_metric("firsttoken_sim_requests_finished_total")
    messages = _enqueue_directly(
        stack, "cancelled before it ran", age_s=0, deadline_in_s=30, cancelled=True
    )
    assert [m[:1] for m in messages] == ["S", "E"], messages
    assert json.loads(messages[1].split("\n", 1)[1])["code"] == "cancelled"
    deadline = time.monotonic() + 5
    while stack.sim_metric("firsttoken_sim_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack.sim_metric("firsttoken_sim_requests_running") == 0
    assert stack.sim_metric("firsttoken_sim_requests_finished_total") == finished


def test_a_running_chat_is_leased_and_started_before_its_first_token(stack: Stack) -> None:
    """The lease and `started` are queued once the engine request is out (off the first
    token's path), still ahead of the answer: a chat streaming has its lease, and its
    channel says `started` before the first token."""
    keys, r, job_id = Keys(stack.prefix), stack.redis(), new_id()
    messages = _enqueue_directly(
        stack, "a leased chat", age_s=0, deadline_in_s=30, until="T", job_id=job_id
    )
    assert [m[:1] for m in messages][:2] == ["S", "T"], messages
    leases = list(r.scan_iter(keys.worker_jobs("*")))
    assert any(r.hexists(key, job_id) for key in leases), leases


def test_a_chat_failing_before_its_engine_request_leaves_no_lease(stack: Stack) -> None:
    """A job for a model no table names (enqueued past the gateway's check) ends
    `invalid_request` while its prompt is built, before or after its lease was queued: no
    lease of it is left for a survivor to take over."""
    keys, r, job_id = Keys(stack.prefix), stack.redis(), new_id()
    messages = _enqueue_directly(
        stack, "no such model", age_s=0, deadline_in_s=30, model="no-such-model", job_id=job_id
    )
    assert messages and messages[-1].startswith("E"), messages
    assert json.loads(messages[-1].split("\n", 1)[1])["code"] == "invalid_request"
    time.sleep(0.2)  # the release is queued right after the error
    assert not any(r.hexists(key, job_id) for key in r.scan_iter(keys.worker_jobs("*")))


async def test_celery_itself_starts_the_same_chat_worker(
    services: Any, migrated: str, tmp_path: Any
) -> None:
    """`celery -A workers.app worker -Q chat` (no firsttoken command around it) is the chat
    worker: tokens in order, `done`, and the usage row (sent as a batch) lands."""
    with make_stack(services, migrated, tmp_path, workers=0) as s:
        s.start(
            "chat0",
            celery_chat_worker(
                f"chat0-{s.prefix}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ),
        )
        s.wait_worker("chat0")
        s.wait_ready()
        async with websockets.connect(
            s.ws_url, additional_headers={"Authorization": f"Bearer {s.api_key}"}
        ) as ws:
            client = Client(ws)
            for chat_id in ("p1", "p2"):
                await client.chat(chat_id, f"which worker answers {chat_id}?")
            for chat_id in ("p1", "p2"):
                job_id = (await client.next_for(chat_id))["job_id"]
                tokens, done = await client.until_end(chat_id)
                assert done["type"] == "done", done
                assert [t["seq"] for t in tokens] == list(range(len(tokens))) and tokens
                rows = await _usage(services.database_url, job_id)
                assert len(rows) == 1 and rows[0].status == "ok"


async def test_usage_rows_record_the_cache_tier_of_a_miss_and_a_hit(
    connect: Any, stack: Stack
) -> None:
    """The first ask of a question looked in the cache and missed; a repeat answered from the
    cache records its tier (exact or semantic) and cached=true."""
    client = await connect()
    await client.chat("tier-0", "which cache tier answered this question?")
    first = (await client.next_for("tier-0"))["job_id"]
    _, done = await client.until_end("tier-0")
    assert done["type"] == "done" and done["cached"] is False
    hit = None
    for i in range(1, 30):  # the cache write is off the hot path: ask until it has landed
        await client.chat(f"tier-{i}", "which cache tier answered this question?")
        accepted = await client.next_for(f"tier-{i}")
        assert "job_id" in accepted, accepted  # an error frame says why it was not taken
        job_id = accepted["job_id"]
        _, done = await client.until_end(f"tier-{i}")
        if done["cached"]:
            hit = job_id
            break
        await asyncio.sleep(0.2)
    assert hit is not None, "the repeat was never answered from the cache"
    (missed,) = await _usage(stack.services.database_url, first)
    (served,) = await _usage(stack.services.database_url, hit)
    assert (missed.cache_tier, missed.cached) == ("miss", False)
    assert served.cache_tier in ("exact", "semantic") and served.cached is True
