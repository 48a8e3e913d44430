"""Faults: no worker, a vanished worker, a worker killed mid-stream. Each ends within a deadline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.keys import CHAT_QUEUE, Keys
from tests.integration.conftest import Services, Stack, losing_stack, make_stack

pytestmark = pytest.mark.integration


# Long enough to cut a connection in the middle of it: 40 tokens, 40 ms apart.
LONG_ANSWER = ("--ttft-ms", "20", "--itl-ms", "40", "--max-tokens", "40")


@contextlib.asynccontextmanager
async def _long_chat_started(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> AsyncIterator[tuple[Stack, Any, dict[str, Any]]]:
    """A stack with long answers, a client, and its 40-token chat "cut" started: (stack,
    client, the chat's first token frame), for cutting a connection mid-answer."""
    with make_stack(services, migrated, tmp_path, bulk=False, sim_args=LONG_ANSWER) as stack:
        stack.wait_ready()
        client = await connect(stack)
        await client.chat("cut", max_tokens=40)
        assert (await client.next_for("cut"))["type"] == "accepted"
        first: dict[str, Any] = await client.next_for("cut")
        assert first["type"] == "token"
        yield stack, client, first


async def _rest_in_order(client: Any, first: dict[str, Any]) -> str:
    """The whole text of chat "cut" whose first token was read: every later seq once, in
    order, then done."""
    frames, done = await client.until_end("cut", timeout=15)
    assert done["type"] == "done", done
    seqs = [f["seq"] for f in frames if f["type"] == "token"]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    return str(first["text"]) + "".join(f["text"] for f in frames)


async def _uncut_text(client: Any, chat_id: str) -> str:
    """The same prompt's answer, run without a fault (the simulator is deterministic)."""
    await client.chat(chat_id, max_tokens=40)
    uncut, done = await client.until_end(chat_id, timeout=15)
    assert done["type"] == "done", done
    return "".join(f["text"] for f in uncut)


async def test_no_chat_worker_means_overloaded_at_once(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    """With no chat worker alive the client gets `overloaded` immediately, not a hang."""
    with make_stack(services, migrated, tmp_path, workers=0, bulk=False) as stack:
        client = await connect(stack)
        started = time.monotonic()
        await client.chat("x")
        err = await client.next_for("x", timeout=5)
        assert err["code"] == "overloaded" and "firsttoken worker" in err["message"]
        assert time.monotonic() - started < 3
        await client.send({"type": "ping", "id": "p"})
        assert (await client.next_for("p"))["type"] == "pong"


async def test_vanished_worker_means_timeout_within_the_queue_deadline(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    """A worker that still looks alive but takes nothing: `timeout` within queue_deadline_s."""
    with make_stack(
        services,
        migrated,
        tmp_path,
        workers=0,
        bulk=False,
        queue_deadline_s="1.5",
        worker_heartbeat_s="30",
    ) as stack:
        keys = Keys(stack.prefix)
        stack.redis().zadd(keys.worker_heartbeats(CHAT_QUEUE), {"ghost": time.time()})
        client = await connect(stack)
        started = time.monotonic()
        await client.chat("q")
        assert (await client.next_for("q"))["type"] == "accepted"
        err = await client.next_for("q", timeout=10)
        waited = time.monotonic() - started
        assert err["code"] == "timeout", err
        assert 1.4 <= waited < 5, waited


async def test_worker_killed_mid_stream_gives_engine_error_and_the_gateway_stays_up(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    """SIGKILL the chat worker mid-answer: `engine_error` within the idle deadline; a new
    worker then serves new chats through the same gateway."""
    with losing_stack(services, migrated, tmp_path) as stack:
        client = await connect(stack)
        await client.chat("k", max_tokens=64)
        assert (await client.next_for("k"))["type"] == "accepted"
        assert (await client.next_for("k"))["type"] == "token"
        stack.procs["chat0"].kill()
        killed = time.monotonic()
        _, end = await client.until_end("k", timeout=10)
        assert end["code"] == "engine_error", end
        assert time.monotonic() - killed < 2 + 1.5  # stream_idle_timeout_s + a watchdog tick
        assert stack.get("/healthz")[0] == 200
        stack.start_worker("chat1")
        stack.wait_worker("chat1")  # chat0's heartbeat still counts for a few seconds
        await client.chat("after", max_tokens=4)
        _, done = await client.until_end("after", timeout=15)
        assert done["type"] == "done", done


async def test_gateway_pubsub_cut_mid_stream_loses_no_token(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    """Kill the gateway's pub/sub connection mid-answer: it reconnects, and the tokens
    published meanwhile come from the job's replay stream: every seq once, in order, then done."""
    async with _long_chat_started(services, migrated, tmp_path, connect) as (stack, client, first):
        admin = stack.redis()
        # The gateway's control channel is named after its pid, and so is its relay connection.
        (control,) = admin.pubsub_channels(f"{stack.prefix}:gw:*")
        name = "firsttoken-relay-" + control.rsplit(":", 1)[1]
        relays = [c for c in admin.client_list() if c["name"] == name]
        assert len(relays) == 1, relays
        admin.client_kill_filter(_id=relays[0]["id"])
        text = await _rest_in_order(client, first)
        assert text == await _uncut_text(client, "uncut")
        assert len([c for c in admin.client_list() if c["name"] == name]) == 1


async def test_redis_pipes_cut_mid_stream_lose_no_token_and_admit_again(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    """Kill the chat worker's and the gateway's pipelined Redis connections mid-answer: the
    worker sends again what was not answered (the gateway drops repeats by seq), the answer is
    the same text as an uncut one, and the next chats are admitted on the new connection."""
    async with _long_chat_started(services, migrated, tmp_path, connect) as (stack, client, first):
        admin = stack.redis()
        pipes = [
            c
            for c in admin.client_list()
            if c["name"].startswith(("firsttoken-worker-", "firsttoken-gateway-"))
        ]
        assert {c["name"].rsplit("-", 1)[0] for c in pipes} == {
            "firsttoken-worker",
            "firsttoken-gateway",
        }, pipes
        for pipe in pipes:
            admin.client_kill_filter(_id=pipe["id"])
        text = await _rest_in_order(client, first)
        # Admitted on the new connections, one after the other.
        assert text == await _uncut_text(client, "after-1")
        assert text == await _uncut_text(client, "after-2")
