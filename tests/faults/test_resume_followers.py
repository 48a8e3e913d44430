"""A second socket resumes a running job (issue 29), on the same gateway process or another:
both sockets stream every remaining token and the `done`, the key's stream slot is freed once,
one socket going away leaves the job running for the other, and a `cancel` ends it for both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import websockets

from firsttoken.procs import gateway_args
from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.support import free_port, port_open, wait_until

pytestmark = pytest.mark.timeout(120)

# Long enough to resume in the middle of it: 40 tokens, 40 ms apart.
LONG_ANSWER = ("--ttft-ms", "20", "--itl-ms", "40", "--max-tokens", "40")


@pytest.fixture(scope="module")
def one_gateway(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One gateway process, one chat worker, long answers; the key may hold one stream, so a
    slot left held shows up as `rate_limited` on the next chat."""
    logs = tmp_path_factory.mktemp("resume-logs")
    with make_stack(
        services, migrated, logs, bulk=False, sim_args=LONG_ANSWER, key_max_streams_default="1"
    ) as stack:
        stack.wait_ready()
        yield stack


@pytest.fixture(scope="module")
def other_gateway(one_gateway: Stack) -> str:
    """A second gateway process of the same stack, on its own port: its websocket URL."""
    port = free_port()
    one_gateway.start("gateway-b", gateway_args(port)["gateway"])
    wait_until(lambda: port_open(port), 20, what="gateway-b")
    return one_gateway.ws_url.replace(str(one_gateway.gateway_port), str(port))


@pytest.fixture
async def sockets(one_gateway: Stack) -> AsyncIterator[Any]:
    """Open websockets with the stack's key, to its gateway or to `url`; closed after."""
    opened: list[Any] = []

    async def _open(url: str | None = None) -> Client:
        headers = {"Authorization": f"Bearer {one_gateway.api_key}"}
        ws = await websockets.connect(url or one_gateway.ws_url, additional_headers=headers)
        opened.append(ws)
        return Client(ws)

    yield _open
    for ws in opened:
        await ws.close()


async def _started(client: Client, chat_id: str, tokens: int) -> tuple[str, list[dict[str, Any]]]:
    """Start a 40-token chat and read its first `tokens` token frames: (job id, tokens)."""
    # Off the cache: a cached answer comes back in one chunk, with nothing to resume.
    await client.chat(chat_id, max_tokens=40, cache=False)
    accepted = await client.next_for(chat_id)
    assert accepted["type"] == "accepted", accepted
    got = [await client.next_for(chat_id) for _ in range(tokens)]
    assert [f["type"] for f in got] == ["token"] * tokens, got
    return str(accepted["job_id"]), got


async def _resume(client: Client, chat_id: str, job_id: str, after_seq: int) -> None:
    await client.send({"type": "resume", "id": chat_id, "job_id": job_id, "after_seq": after_seq})
    accepted = await client.next_for(chat_id)
    assert accepted["type"] == "accepted" and accepted["job_id"] == job_id, accepted


def _slots_held(stack: Stack) -> int:
    with stack.redis() as admin:
        return sum(int(admin.zcard(k)) for k in admin.scan_iter(f"{stack.prefix}:streams:*"))


async def _slot_free_again(stack: Stack, client: Client, chat_id: str) -> None:
    """The key's only stream slot was given back: a new chat is admitted and answered."""
    for _ in range(50):  # settlement is queued on the gateway's pipe: a moment after the end
        if _slots_held(stack) == 0:
            break
        await asyncio.sleep(0.05)
    assert _slots_held(stack) == 0
    await client.chat(chat_id, max_tokens=2)
    _, end = await client.until_end(chat_id)
    assert end["type"] == "done", end


async def test_two_sockets_on_one_gateway_both_get_the_rest_and_the_slot_is_freed(
    one_gateway: Stack, sockets: Any
) -> None:
    """Original and resumer (after_seq 2) each get every later seq once, in order, and done."""
    original = await sockets()
    job_id, first = await _started(original, "orig", 5)
    resumer = await sockets()
    await _resume(resumer, "again", job_id, after_seq=2)
    (rest_o, done_o), (rest_r, done_r) = await asyncio.gather(
        original.until_end("orig", 20), resumer.until_end("again", 20)
    )
    assert done_o["type"] == "done" and done_r["type"] == "done", (done_o, done_r)
    seq_o = [f["seq"] for f in first + rest_o]
    seq_r = [f["seq"] for f in rest_r]
    assert seq_o == list(range(len(seq_o))), seq_o
    assert seq_r == list(range(3, len(seq_o))), seq_r
    assert all(f["id"] == "again" for f in [*rest_r, done_r])
    text = "".join(f["text"] for f in first + rest_o)
    assert "".join(f["text"] for f in first[:3] + rest_r) == text
    assert done_r["usage"] == done_o["usage"]
    await _slot_free_again(one_gateway, resumer, "next")


async def test_the_original_socket_closing_leaves_the_job_running_for_the_resumer(
    one_gateway: Stack, sockets: Any
) -> None:
    """The socket that started the job disconnects while a resume follows it: no cancel; the
    resumer gets the whole rest and done, and the slot is freed when the job ends."""
    original = await sockets()
    job_id, _ = await _started(original, "orig", 3)
    resumer = await sockets()
    await _resume(resumer, "again", job_id, after_seq=2)
    await original.ws.close()
    rest, done = await resumer.until_end("again", 20)
    assert done["type"] == "done", done
    seqs = [f["seq"] for f in rest]
    assert seqs and seqs == list(range(3, 3 + len(seqs))), seqs
    await _slot_free_again(one_gateway, resumer, "next")


async def test_the_resumer_closing_leaves_the_original_streaming(
    one_gateway: Stack, sockets: Any
) -> None:
    """The other way round: the resumer goes, the original socket streams on to done."""
    original = await sockets()
    job_id, first = await _started(original, "orig", 3)
    resumer = await sockets()
    await _resume(resumer, "again", job_id, after_seq=0)
    await resumer.next_for("again")  # a replayed token: the resume is following
    await resumer.ws.close()
    rest, done = await original.until_end("orig", 20)
    assert done["type"] == "done", done
    seqs = [f["seq"] for f in first + rest]
    assert seqs == list(range(len(seqs))) and len(seqs) > 3, seqs
    await _slot_free_again(one_gateway, original, "next")


async def test_a_cancel_from_one_follower_ends_the_chat_for_both(
    one_gateway: Stack, sockets: Any
) -> None:
    """`cancel` on the resumer stops the job itself: both sockets end with `cancelled`, at once,
    and the slot is freed."""
    original = await sockets()
    job_id, _ = await _started(original, "orig", 3)
    resumer = await sockets()
    await _resume(resumer, "again", job_id, after_seq=2)
    await resumer.send({"type": "cancel", "id": "again"})
    (_, end_r), (_, end_o) = await asyncio.gather(
        resumer.until_end("again", 5), original.until_end("orig", 5)
    )
    assert end_r["code"] == "cancelled" and end_o["code"] == "cancelled", (end_r, end_o)
    await _slot_free_again(one_gateway, original, "next")


async def test_the_original_closing_leaves_the_job_running_for_a_resumer_on_another_gateway(
    one_gateway: Stack, other_gateway: str, sockets: Any
) -> None:
    """The resume is on another gateway process: the original's disconnect does not cancel
    the job there either; the resumer gets the whole rest and done."""
    original = await sockets()
    job_id, _ = await _started(original, "orig", 3)
    resumer = await sockets(other_gateway)
    await _resume(resumer, "again", job_id, after_seq=2)
    await original.ws.close()
    rest, done = await resumer.until_end("again", 20)
    assert done["type"] == "done", done
    seqs = [f["seq"] for f in rest]
    assert seqs and seqs == list(range(3, 3 + len(seqs))), seqs
    await _slot_free_again(one_gateway, resumer, "next")


async def test_a_cancel_on_another_gateway_ends_the_chat_for_both(
    one_gateway: Stack, other_gateway: str, sockets: Any
) -> None:
    """`cancel` on the resumer's gateway stops the worker, whose `cancelled` reaches the
    original socket on the first gateway too."""
    original = await sockets()
    job_id, _ = await _started(original, "orig", 3)
    resumer = await sockets(other_gateway)
    await _resume(resumer, "again", job_id, after_seq=2)
    await resumer.send({"type": "cancel", "id": "again"})
    (_, end_r), (_, end_o) = await asyncio.gather(
        resumer.until_end("again", 5), original.until_end("orig", 5)
    )
    assert end_r["code"] == "cancelled" and end_o["code"] == "cancelled", (end_r, end_o)
    await _slot_free_again(one_gateway, original, "next")


async def test_a_resumer_on_another_gateway_closing_leaves_the_original_streaming(
    one_gateway: Stack, other_gateway: str, sockets: Any
) -> None:
    """The resumer's gateway gives the job up: the admitting gateway still follows it (its
    admission recorded it), so the job is not cancelled and the original gets done."""
    original = await sockets()
    job_id, first = await _started(original, "orig", 3)
    resumer = await sockets(other_gateway)
    await _resume(resumer, "again", job_id, after_seq=0)
    await resumer.next_for("again")  # a replayed token: the resume is following
    await resumer.ws.close()
    rest, done = await original.until_end("orig", 20)
    assert done["type"] == "done", done
    seqs = [f["seq"] for f in first + rest]
    assert seqs == list(range(len(seqs))) and len(seqs) > 3, seqs
    await _slot_free_again(one_gateway, original, "next")
