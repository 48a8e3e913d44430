"""Fuzzing a live gateway: random and malformed frames over real websockets.

No crash, no hang (every batch is followed by a ping that must be answered), nothing leaked
(the gateway's stream and connection gauges and Redis's job subscriptions return to zero), and
a chat on another connection streams to its end meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import Client, Stack
from tests.unit.shared.test_limits_fuzz import FRAMES, NO_SURROGATES

pytestmark = pytest.mark.integration

# Text frames must be UTF-8 on the wire (the client library encodes them); lone surrogates
# reach the gateway as JSON escapes instead, which json.dumps writes for them.
WIRE = st.one_of(
    FRAMES.map(json.dumps),
    FRAMES.map(json.dumps).map(lambda t: t[: len(t) // 2]),
    st.text(NO_SURROGATES, max_size=200),
    st.binary(max_size=200),
    st.sampled_from(["[" * 20_000, "{}", "null", '{"type":"chat"}', '{"type":"cancel","id":"x"}']),
)


def _gauge(stack: Stack, name: str) -> float:
    _, text = stack.get("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def _job_subscriptions(stack: Stack) -> list[str]:
    client: redis.Redis = stack.redis()
    try:
        return list(client.pubsub_channels(f"{stack.prefix}:job:*"))
    finally:
        client.close()


async def _batch(stack: Stack, frames: list[str | bytes], tag: int) -> None:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
        for frame in frames:
            await ws.send(frame)
        probe = f"probe-{tag}"
        await ws.send(json.dumps({"type": "ping", "id": probe}))
        deadline = time.monotonic() + 10
        while True:  # frames are handled in order: the pong means all before it were too
            reply = json.loads(await asyncio.wait_for(ws.recv(), deadline - time.monotonic()))
            if reply.get("type") == "pong" and reply.get("id") == probe:
                return


_seen = {"n": 0}


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(WIRE, min_size=25, max_size=80))
def _fuzz_live(stack: Stack, frames: list[str | bytes]) -> None:
    _seen["n"] += len(frames)
    asyncio.run(asyncio.wait_for(_batch(stack, frames, _seen["n"]), 30))


# A failing example of 25-80 frames can print to more than 30 kB; Hypothesis then warns while
# reporting it, and as an error that warning would hide the failure itself.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
async def test_live_endpoint_survives_random_frames(stack: Stack, connect: Any) -> None:
    """Thousands of random frames: all answered, nothing leaked, a parallel chat unaffected."""
    watcher: Client = await connect()
    await watcher.chat("steady", "keep streaming while the fuzzer runs", max_tokens=32)
    assert (await watcher.next_for("steady"))["type"] == "accepted"
    started = time.monotonic()
    # Hypothesis drives a synchronous test; run it in a thread so this loop keeps the
    # watcher's socket served meanwhile.
    await asyncio.to_thread(_fuzz_live, stack)
    assert _seen["n"] >= 1250 and time.monotonic() - started < 90
    tokens, done = await watcher.until_end("steady", timeout=30)
    assert done["type"] == "done" and [t["seq"] for t in tokens] == list(range(len(tokens)))
    deadline = time.monotonic() + 15
    while True:
        leaks = (
            _gauge(stack, "firsttoken_gateway_streams"),
            _gauge(stack, "firsttoken_gateway_connections"),
            _job_subscriptions(stack),
        )
        if leaks == (0.0, 1.0, []):  # only the watcher is still connected
            break
        assert time.monotonic() < deadline, f"leaked (streams, connections, channels): {leaks}"
        await asyncio.sleep(0.2)
