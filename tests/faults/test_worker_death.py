"""A chat worker SIGKILLed under its chats (issue 29): another worker runs again the chats it
had not started answering and continues those it had, from the text already sent; with no
other worker every client gets `engine_error` within the heartbeat loss (3 s), not the idle
deadline. Every chat gets its usage row either way."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from sqlalchemy import text

from shared.db.session import make_engine
from shared.keys import CHAT_QUEUE, Keys
from tests.integration.conftest import Client, Services, Stack, make_stack

pytestmark = pytest.mark.timeout(180)

PROMPT = "tell me a long story"
# Long answers: 30 to 60 tokens, 60 ms apart (2-4 s each), so a kill lands mid-answer.
LONG = ("--ttft-ms", "20", "--itl-ms", "60", "--max-tokens", "60")
SETTINGS = {"worker_lost_after_s": "2", "stream_idle_timeout_s": "2"}


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


@pytest.fixture
async def opened() -> AsyncIterator[list[Any]]:
    """Websockets a test opened (with `connect`), closed after it."""
    sockets: list[Any] = []
    yield sockets
    for ws in sockets:
        await ws.close()


async def connect(stack: Stack, opened: list[Any]) -> Client:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    ws = await websockets.connect(stack.ws_url, additional_headers=headers)
    opened.append(ws)
    return Client(ws)


def leases(stack: Stack, worker: str) -> set[str]:
    """The job ids whose lease worker `worker` (its test name) holds now."""
    with stack.redis() as admin:
        keys = list(admin.scan_iter(f"{stack.prefix}:jobs:{worker}-*"))
        return {str(job) for key in keys for job in admin.hkeys(key)}


async def usage_rows(stack: Stack, job_ids: list[str], timeout: float = 20.0) -> dict[str, Any]:
    """request_id -> (status, completion_tokens, finish_reason) once all `job_ids` have a row."""
    engine = make_engine(stack.services.database_url)
    deadline = time.monotonic() + timeout
    rows: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                result = await conn.execute(
                    text(
                        "SELECT request_id, status, completion_tokens, finish_reason "
                        "FROM usage_events WHERE request_id = ANY(:ids)"
                    ),
                    {"ids": job_ids},
                )
                rows = {r[0]: tuple(r[1:]) for r in result}
            if len(rows) == len(job_ids):
                return rows
            await asyncio.sleep(0.25)
    finally:
        await engine.dispose()
    return rows


async def start_chats(client: Client, count: int, max_tokens: int = 60) -> dict[str, str]:
    """`count` chats of the same prompt, off the cache: chat id -> job id."""
    ids = [f"c{i}" for i in range(count)]
    for chat_id in ids:
        await client.chat(chat_id, PROMPT, max_tokens=max_tokens, cache=False)
    jobs = {}
    for chat_id in ids:
        accepted = await client.next_for(chat_id)
        assert accepted["type"] == "accepted", accepted
        jobs[chat_id] = str(accepted["job_id"])
    return jobs


async def all_ends(
    client: Client, chat_ids: list[str], timeout: float = 30.0
) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any], float]]:
    """Every chat's token frames, its `done` or `error`, and when that came (monotonic); read
    from one socket in turn (a websocket has one reader)."""
    out: dict[str, tuple[list[dict[str, Any]], dict[str, Any], float]] = {}
    tokens: dict[str, list[dict[str, Any]]] = {c: [] for c in chat_ids}
    deadline = time.monotonic() + timeout
    while len(out) < len(chat_ids):
        for c in chat_ids:
            while c not in out and client.frames.get(c):
                frame = client.frames[c].pop(0)
                if frame["type"] == "token":
                    frame.setdefault("_at", time.monotonic())
                    tokens[c].append(frame)
                elif frame["type"] in ("done", "error"):
                    out[c] = (tokens[c], frame, time.monotonic())
        if len(out) == len(chat_ids):
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"chats without an end: {sorted(set(chat_ids) - set(out))}")
        raw = await asyncio.wait_for(client.ws.recv(), left)
        frame = json.loads(raw)
        frame["_at"] = time.monotonic()  # when it arrived (the test's own field)
        client.frames.setdefault(frame.get("id"), []).append(frame)
    return out


def seqs_contiguous(tokens: list[dict[str, Any]]) -> bool:
    return [f["seq"] for f in tokens] == list(range(len(tokens)))


def answer(tokens: list[dict[str, Any]]) -> str:
    return "".join(f["text"] for f in tokens)


async def test_a_worker_killed_under_twenty_streaming_chats_loses_none_of_them(
    services: Services, migrated: str, logs: Path, opened: list[Any]
) -> None:
    """SIGKILL one of two chat workers mid-answer: every chat ends `done`, seqs contiguous,
    each continued answer is the one the prompt gets uncut, `done.continued` marks exactly
    chats of the dead worker, and every chat has its usage row."""
    with make_stack(services, migrated, logs, workers=2, sim_args=LONG, **SETTINGS) as stack:
        stack.wait_worker("chat0")
        stack.wait_worker("chat1")
        client = await connect(stack, opened)
        jobs = await start_chats(client, 20)
        # Every chat sends its first tokens (on both workers), then the busier one dies.
        firsts = {c: await client.next_for(c) for c in jobs}
        assert all(f["type"] == "token" for f in firsts.values()), firsts
        await asyncio.sleep(0.5)
        held = {w: leases(stack, w) for w in ("chat0", "chat1")}
        victim = max(held, key=lambda w: len(held[w]))
        assert held[victim], held
        stack.procs[victim].kill()
        killed = time.monotonic()
        for c, f in firsts.items():
            client.frames.setdefault(c, []).insert(0, f)
        ended = await all_ends(client, list(jobs))
        took = max(at for _, _, at in ended.values()) - killed
        ends = {c: (tokens, end) for c, (tokens, end, _) in ended.items()}
        dones = {c: end for c, (_, end) in ends.items()}
        assert all(d["type"] == "done" for d in dones.values()), [
            d for d in dones.values() if d["type"] != "done"
        ]
        assert all(seqs_contiguous(tokens) for tokens, _ in ends.values())
        texts = {answer(tokens) for tokens, _ in ends.values()}
        assert len(texts) == 1, texts  # the same prompt: the same answer, cut or not
        continued = {jobs[c] for c, d in dones.items() if d.get("continued")}
        assert continued and continued <= held[victim], (continued, held)
        rows = await usage_rows(stack, list(jobs.values()))
        assert len(rows) == 20, rows
        words = len(texts.pop().split())
        assert all(r[0] == "ok" and r[1] == words for r in rows.values()), rows
        # The longest pause in a continued chat's tokens: the death, its detection, the claim
        # and the continuation's first token.
        pause = max(
            max(b["_at"] - a["_at"] for a, b in itertools.pairwise(tokens))
            for c, (tokens, _) in ends.items()
            if jobs[c] in continued
        )
        print(
            f"\n{len(continued)} of {len(held[victim])} chats continued; longest pause in a "
            f"continued chat {pause:.2f}s; all done {took:.2f}s after the kill"
        )


async def test_chats_a_killed_worker_had_not_started_answering_run_on_the_other(
    services: Services, migrated: str, logs: Path, opened: list[Any]
) -> None:
    """The chats a worker took but had no token of yet (a slow first token) run again on the
    other worker when it is killed: every one ends `done`, none with an error, none continued."""
    slow_first = ("--ttft-ms", "2500", "--itl-ms", "10", "--max-tokens", "16")
    # The engine's first-token deadline above the slow first token (and its rerun's).
    with make_stack(
        services,
        migrated,
        logs,
        workers=2,
        sim_args=slow_first,
        worker_lost_after_s="2",
        stream_idle_timeout_s="10",
        first_token_deadline_s="8",
    ) as stack:
        stack.wait_worker("chat0")
        stack.wait_worker("chat1")
        client = await connect(stack, opened)
        jobs = await start_chats(client, 8, max_tokens=16)
        await asyncio.sleep(0.8)  # picked up (leases written), no token yet
        held = {w: leases(stack, w) for w in ("chat0", "chat1")}
        victim = max(held, key=lambda w: len(held[w]))
        assert held[victim], held
        stack.procs[victim].kill()
        killed = time.monotonic()
        ended = await all_ends(client, list(jobs))
        took = max(at for _, _, at in ended.values()) - killed
        ends = [(tokens, end) for tokens, end, _ in ended.values()]
        assert all(end["type"] == "done" for _, end in ends), [e for _, e in ends]
        assert all(seqs_contiguous(tokens) for tokens, _ in ends)
        assert not any(end.get("continued") for _, end in ends)
        assert len({answer(tokens) for tokens, _ in ends}) == 1
        rows = await usage_rows(stack, list(jobs.values()))
        assert len(rows) == 8 and all(r[0] == "ok" for r in rows.values()), rows
        print(f"\n{len(held[victim])} chats run again; all done {took:.2f}s after the kill")


async def test_a_chat_taken_off_the_queue_by_a_worker_that_died_runs_on_another(
    services: Services, migrated: str, logs: Path, opened: list[Any]
) -> None:
    """The message of a chat taken off the queue by a worker killed before it wrote anything
    (the BRPOP's reply read, no lease, no `started`): the gateway finds it neither queued nor
    started and queues it again, and a survivor answers it, `done` with no error, well within
    the queue deadline."""
    with make_stack(
        services, migrated, logs, worker_lost_after_s="2", queue_deadline_s="20"
    ) as stack:
        stack.wait_worker("chat0")
        stack.procs["chat0"].popen.send_signal(signal.SIGSTOP)  # alive to the gateway, no reads
        # The survivor starts now: warming up, it is a worker on its way, and the gateway keeps
        # the chat for it rather than end it for want of a worker (issue 42).
        stack.start_worker("chat1")
        client = await connect(stack, opened)
        await client.chat("lost", PROMPT, cache=False, max_tokens=8)
        accepted = await client.next_for("lost")
        assert accepted["type"] == "accepted", accepted
        await asyncio.sleep(0.3)
        queue = Keys(stack.prefix).queue_list(CHAT_QUEUE)
        with stack.redis() as admin:
            # The frozen worker's BRPOP, sent before the stop, took it already (Redis hands a
            # blocked client the message as it arrives); else take it as that BRPOP would.
            admin.rpop(queue)
            assert admin.llen(queue) == 0
        stack.procs["chat0"].kill()
        taken = time.monotonic()
        tokens, end = await client.until_end("lost", timeout=20)
        took = time.monotonic() - taken
        print(f"\nlost off the queue: done {took:.2f}s after the worker took it")
        assert end["type"] == "done", end
        assert not end.get("continued") and seqs_contiguous(tokens)
        assert took < 10, took


async def test_the_only_worker_killed_mid_answer_ends_every_chat_within_three_seconds(
    services: Services, migrated: str, logs: Path, opened: list[Any]
) -> None:
    """No worker left to continue: every client gets `engine_error` within the heartbeat loss
    (3 s, plus a watchdog and count period), and each chat's usage row says `error` with the
    tokens it delivered."""
    slow = ("--ttft-ms", "20", "--itl-ms", "100", "--max-tokens", "64")
    with make_stack(
        services, migrated, logs, workers=1, sim_args=slow, stream_idle_timeout_s="10"
    ) as stack:
        stack.wait_worker("chat0")
        client = await connect(stack, opened)
        jobs = await start_chats(client, 5, max_tokens=64)
        got: dict[str, list[dict[str, Any]]] = {c: [] for c in jobs}
        for c in jobs:
            got[c] += [await client.next_for(c) for _ in range(3)]
        stack.procs["chat0"].kill()
        killed = time.monotonic()
        ended = await all_ends(client, list(jobs), 15)
        took = max(at for _, _, at in ended.values()) - killed
        ends = [(rest, end) for rest, end, _ in ended.values()]
        assert all(end.get("code") == "engine_error" for _, end in ends), [e for _, e in ends]
        assert took < 3.0 + 1.0, took
        tokens = {c: got[c] + ended[c][0] for c in jobs}
        assert all(seqs_contiguous(t) for t in tokens.values())
        rows = await usage_rows(stack, list(jobs.values()))
        assert len(rows) == 5, rows
        for c, job_id in jobs.items():
            status, completion, reason = rows[job_id]
            assert status == "error" and reason == "engine_error", rows[job_id]
            assert completion == len(answer(tokens[c]).split()), (completion, tokens[c])
        print(f"\nengine_error on all 5 chats {took:.2f}s after the kill")


async def test_a_worker_frozen_past_its_lease_stands_down_when_it_wakes(
    services: Services, migrated: str, logs: Path, opened: list[Any]
) -> None:
    """SIGSTOP a worker for longer than the lease: the other one takes its chats over, and the
    frozen one, woken, sends nothing more for them (its fence holds its chunks until its keeper
    sees the claim): every chat ends `done` once with the one answer, seqs contiguous."""
    with make_stack(services, migrated, logs, workers=2, sim_args=LONG, **SETTINGS) as stack:
        stack.wait_worker("chat0")
        stack.wait_worker("chat1")
        client = await connect(stack, opened)
        jobs = await start_chats(client, 10)
        await asyncio.sleep(0.8)
        held = {w: leases(stack, w) for w in ("chat0", "chat1")}
        victim = max(held, key=lambda w: len(held[w]))
        assert held[victim], held
        pid = stack.procs[victim].pid
        os.killpg(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(3.5)  # past worker_lost_after_s and a claim
        finally:
            os.killpg(pid, signal.SIGCONT)
        ended = await all_ends(client, list(jobs))
        ends = [(tokens, end) for tokens, end, _ in ended.values()]
        assert all(end["type"] == "done" for _, end in ends), [e for _, e in ends]
        assert all(seqs_contiguous(tokens) for tokens, _ in ends)
        assert len({answer(tokens) for tokens, _ in ends}) == 1
        continued = {jobs[c] for c, (_, end, _) in ended.items() if end.get("continued")}
        assert continued and continued <= held[victim], (continued, held)
        rows = await usage_rows(stack, list(jobs.values()))
        assert len(rows) == 10 and all(r[0] == "ok" for r in rows.values()), rows
        assert "standing down" in stack.procs[victim].output()
