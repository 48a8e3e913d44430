"""The pub/sub subscriber (shared/redis/pubsub.py) on a real Redis: routing by channel,
unsubscribe, confirmation, a killed connection that comes back subscribed, and a refused one
that is not retried in a tight loop."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.redis.pubsub import Subscriber
from tests.integration.conftest import Services


@pytest.fixture
async def admin(services: Services) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def started(services: Services) -> AsyncIterator[tuple[str, Subscriber]]:
    """A started subscriber and the channel-name prefix of this test (closed afterwards)."""
    name = f"ftsub{uuid.uuid4().hex[:8]}"
    subscriber = Subscriber(services.redis_url)
    await subscriber.start()
    try:
        yield name, subscriber
    finally:
        await subscriber.close()


async def _until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _unsubscribed(admin: aioredis.Redis, *channels: str) -> None:
    """Wait until Redis counts no subscriber on any of `channels` (at most 2 s)."""
    for _ in range(100):
        if not any(count for _, count in await admin.pubsub_numsub(*channels)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still subscribed: {await admin.pubsub_numsub(*channels)}")


async def test_messages_reach_their_channel_handler_only(
    started: tuple[str, Subscriber], admin: aioredis.Redis
) -> None:
    name, subscriber = started
    got: dict[str, list[str]] = {"a": [], "b": []}
    await subscriber.subscribe_confirmed(f"{name}:a", got["a"].append)
    subscriber.subscribe(f"{name}:b", got["b"].append)
    await _until(lambda: subscriber.channels == 2)
    await admin.publish(f"{name}:b", "warm")  # published after b's SUBSCRIBE was read
    await _until(lambda: got["b"] == ["warm"])
    for i in range(20):
        await admin.publish(f"{name}:a", f"a{i}")
        await admin.publish(f"{name}:b", "ü" * i)
    await _until(lambda: len(got["a"]) == 20 and len(got["b"]) == 21)
    assert got["a"] == [f"a{i}" for i in range(20)]
    assert got["b"][1:] == ["ü" * i for i in range(20)]

    subscriber.unsubscribe(f"{name}:a")
    assert subscriber.channels == 1
    await _unsubscribed(admin, f"{name}:a")
    await admin.publish(f"{name}:a", "late")
    await admin.publish(f"{name}:b", "last")
    await _until(lambda: got["b"][-1] == "last")
    assert got["a"][-1] == "a19"


async def test_a_failing_handler_does_not_stop_the_others(
    started: tuple[str, Subscriber], admin: aioredis.Redis
) -> None:
    name, subscriber = started
    got: list[str] = []

    def broken(_message: str) -> None:
        raise RuntimeError("handler bug")

    await subscriber.subscribe_confirmed(f"{name}:broken", broken)
    await subscriber.subscribe_confirmed(f"{name}:ok", got.append)
    await admin.publish(f"{name}:broken", "x")
    await admin.publish(f"{name}:ok", "y")
    await _until(lambda: got == ["y"])


async def test_killed_connection_comes_back_subscribed(
    services: Services, admin: aioredis.Redis
) -> None:
    name = f"ftsub{uuid.uuid4().hex[:8]}"
    reconnected: list[int] = []
    subscriber = Subscriber(
        services.redis_url, on_reconnect=lambda: reconnected.append(1), client_name=name
    )
    await subscriber.start()
    got: list[str] = []
    try:
        await subscriber.subscribe_confirmed(f"{name}:job", got.append)
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert len(ids) == 1
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        # A channel added while the connection is down is subscribed on reconnect too.
        await _until(lambda: not subscriber.connected)
        subscriber.subscribe(f"{name}:new", got.append)
        await _until(lambda: reconnected == [1])
        await _until(lambda: subscriber.connected)
        # Both channels answer again, on the new connection.
        for _ in range(100):
            if (await admin.pubsub_numsub(f"{name}:job", f"{name}:new")) == [
                (f"{name}:job", 1),
                (f"{name}:new", 1),
            ]:
                break
            await asyncio.sleep(0.02)
        await admin.publish(f"{name}:job", "after")
        await admin.publish(f"{name}:new", "new")
        await _until(lambda: got == ["after", "new"])
        assert subscriber.reconnects == 1
    finally:
        await subscriber.close()
    assert not subscriber.connected


async def test_on_reconnect_waits_until_redis_has_every_channel_again(
    services: Services, admin: aioredis.Redis
) -> None:
    """The gateway reads each job's replay stream in `on_reconnect`: had it run before Redis
    processed the SUBSCRIBEs, a chunk published in between would be in neither. With many
    channels Redis reads the SUBSCRIBEs over many turns, and a reply to another client comes
    in between; so the callback asks Redis itself (a blocking client) whether the last channel
    is subscribed yet."""
    import redis as sync_redis

    name = f"ftsub{uuid.uuid4().hex[:8]}"
    probe = sync_redis.Redis.from_url(services.redis_url)
    counted: list[int] = []

    def on_reconnect() -> None:
        counted.append(int(probe.pubsub_numsub(last)[0][1]))

    channels = [f"{name}:{i:05d}:{'x' * 40}" for i in range(20_000)]
    last = channels[-1]
    subscriber = Subscriber(services.redis_url, on_reconnect=on_reconnect, client_name=name)
    await subscriber.start()
    try:
        for channel in channels[:-1]:
            subscriber.subscribe(channel, lambda _m: None)
        await subscriber.subscribe_confirmed(last, lambda _m: None)
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        await _until(lambda: counted != [], timeout=20)
        assert counted == [1]
    finally:
        await subscriber.close()
        probe.close()


async def test_password_is_sent_and_a_wrong_one_is_not_retried_in_a_tight_loop(
    password_redis: int, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://:s3cret@127.0.0.1:{password_redis}/0"
    subscriber = Subscriber(url)
    await subscriber.start()
    got: list[str] = []
    admin = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await subscriber.subscribe_confirmed("job", got.append)
        await admin.publish("job", "hello")
        await _until(lambda: got == ["hello"])
    finally:
        await subscriber.close()
        await admin.aclose()

    wrong = Subscriber(f"redis://:nope@127.0.0.1:{password_redis}/0")
    with caplog.at_level(logging.WARNING, logger="shared.redis.pubsub"):
        await wrong.start()
        with pytest.raises(ConnectionError, match="WRONGPASS"):
            await wrong.subscribe_confirmed("ctl", got.append)  # at once, saying why
        await wrong.close()
        retrying = Subscriber(f"redis://:nope@127.0.0.1:{password_redis}/0")
        retrying.subscribe("job", got.append)  # what a running gateway does on a reconnect
        await retrying._connect()
        await asyncio.sleep(1.5)
        await retrying.close()
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refused and "WRONGPASS" in refused[0].getMessage()
    assert len(refused) <= 3  # one attempt a second, not a spin


async def test_finished_channels_leave_together_and_a_resubscribed_one_stays(
    started: tuple[str, Subscriber], admin: aioredis.Redis
) -> None:
    name, subscriber = started
    got: list[str] = []
    for job in ("a", "b", "c"):
        await subscriber.subscribe_confirmed(f"{name}:{job}", got.append)
    subscriber.unsubscribe(f"{name}:a")
    subscriber.unsubscribe(f"{name}:b")
    subscriber.unsubscribe(f"{name}:c")
    await subscriber.subscribe_confirmed(f"{name}:c", got.append)  # resumed before they left
    # Routing stops at once, before Redis has heard of it.
    await admin.publish(f"{name}:a", "late")
    assert subscriber.channels == 1  # c
    await _until(lambda: subscriber._leave_timer is None)
    await _unsubscribed(admin, f"{name}:a", f"{name}:b")
    assert (await admin.pubsub_numsub(f"{name}:c"))[0][1] == 1
    await admin.publish(f"{name}:c", "still here")
    await _until(lambda: got == ["still here"])
