"""Rate limits in real Redis: exact across processes, reservations and refunds, stream leases."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import websockets

from firsttoken.keyscli import create_key
from gateway.ratelimit import Enqueue, RateLimiter
from gateway.rates import Limits
from shared.errors import Overloaded, RateLimited, Unauthorized
from shared.keys import Keys
from shared.redis.pipe import RedisPipe
from shared.settings import Settings, load_settings
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import free_port, port_open, throwaway_redis_server, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
async def limiter(services: Services) -> AsyncIterator[tuple[RateLimiter, Keys]]:
    """A limiter on the real Redis under a fresh prefix, cleaned up after."""
    keys = Keys(f"ftrl{uuid.uuid4().hex[:8]}")
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    pipe = RedisPipe(services.redis_url)
    await pipe.start()
    yield RateLimiter(pipe, keys, lease_s=1.0), keys
    await pipe.close()
    found = [k async for k in client.scan_iter(f"{keys.prefix}:*")]
    if found:
        await client.delete(*found)
    await client.aclose()


async def _admit(lim: RateLimiter, limits: Limits, tokens: int = 1, key: str = "k") -> bool:
    try:
        await lim.admit(
            job_id=uuid.uuid4().hex,
            key_id=key,
            tenant_id="t",
            limits=limits,
            tokens=tokens,
            prompt_estimate=0,
        )
        return True
    except RateLimited:
        return False


async def test_concurrent_admissions_from_three_clients_are_exact(
    services: Services, limiter: tuple[RateLimiter, Keys]
) -> None:
    """300 concurrent admissions over three Redis connections, limit 100 rpm: exactly 100 pass."""
    _, keys = limiter
    pipes = [RedisPipe(services.redis_url) for _ in range(3)]
    for pipe in pipes:
        await pipe.start()
    lims = [RateLimiter(p, keys, lease_s=60) for p in pipes]
    results = await asyncio.gather(*(_admit(lims[i % 3], Limits(key_rpm=100)) for i in range(300)))
    for pipe in pipes:
        await pipe.close()
    assert sum(results) == 100


async def test_refused_request_says_when_to_retry(limiter: tuple[RateLimiter, Keys]) -> None:
    """Over rpm: RateLimited with retry_after_ms within the 60 s window."""
    lim, _ = limiter
    assert await _admit(lim, Limits(key_rpm=1))
    with pytest.raises(RateLimited) as info:
        await lim.admit(
            job_id="x",
            key_id="k",
            tenant_id="t",
            limits=Limits(key_rpm=1),
            tokens=1,
            prompt_estimate=0,
        )
    assert info.value.retry_after_ms is not None and 59_000 < info.value.retry_after_ms <= 60_000
    assert "requests per minute" in info.value.message


async def test_reservation_and_refund_arithmetic_in_redis(
    services: Services, limiter: tuple[RateLimiter, Keys]
) -> None:
    """Reserve 800 of 1000 tpm, refuse 300 more, settle to 100 used, then 300 fits; sums agree."""
    lim, keys = limiter
    limits = Limits(key_tpm=1000, tenant_tpm=5000)
    first = await lim.admit(
        job_id="a", key_id="k", tenant_id="t", limits=limits, tokens=800, prompt_estimate=50
    )
    assert not await _admit(lim, limits, tokens=300)
    lim.settle(first, 100)
    await lim.flush()
    r = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    assert await r.hget(keys.rate_tokens("key", "k"), "=sum") == "100"
    assert await r.hget(keys.rate_tokens("tenant", "t"), "=sum") == "100"
    assert await _admit(lim, limits, tokens=300)
    assert await r.hget(keys.rate_tokens("key", "k"), "=sum") == "400"
    lim.settle(first, 0)  # a second settle is a no-op
    await lim.flush()
    assert await r.hget(keys.rate_tokens("key", "k"), "=sum") == "400"
    await r.aclose()


async def test_an_admission_run_twice_charges_and_enqueues_once(
    services: Services, limiter: tuple[RateLimiter, Keys]
) -> None:
    """The gateway's pipe sends a call again after a lost connection, so one job's admission
    may run twice: the second run finds the owner record and changes nothing."""
    lim, keys = limiter
    limits = Limits(key_rpm=10, key_tpm=1000, key_streams=5)
    enqueue = Enqueue(keys.queue_list("chat"), "the task", keys.job_owner("j1"), 60)
    for _ in range(2):
        await lim.admit(
            job_id="j1",
            key_id="k",
            tenant_id="t",
            limits=limits,
            tokens=100,
            prompt_estimate=10,
            enqueue=enqueue,
        )
    r = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        assert await r.lrange(keys.queue_list("chat"), 0, -1) == ["the task"]
        assert await r.zcard(keys.rate_window("key", "k")) == 1
        assert await r.hget(keys.rate_tokens("key", "k"), "=sum") == "100"
        assert await r.zcard(keys.key_streams("k")) == 1
    finally:
        await r.aclose()


async def test_tenant_limit_spans_its_keys(limiter: tuple[RateLimiter, Keys]) -> None:
    """Two keys of one tenant share the tenant's rpm."""
    lim, _ = limiter
    limits = Limits(key_rpm=10, tenant_rpm=3)
    got = [await _admit(lim, limits, key=k) for k in ("a", "b", "a", "b")]
    assert got == [True, True, True, False]


async def test_stream_slots_are_freed_on_settle_and_leases_expire(
    limiter: tuple[RateLimiter, Keys],
) -> None:
    """max_streams=1: a second stream waits; settle frees the slot; an unrenewed lease expires."""
    lim, _ = limiter
    limits = Limits(key_streams=1)
    first = await lim.admit(
        job_id="s1", key_id="k", tenant_id="t", limits=limits, tokens=1, prompt_estimate=0
    )
    assert not await _admit(lim, limits)
    lim.settle(first, 1)
    assert await _admit(lim, limits)  # this one is never settled: a "crashed gateway"
    lim.live.clear()
    assert not await _admit(lim, limits)
    await asyncio.sleep(1.1)
    assert await _admit(lim, limits)


async def test_renewed_lease_outlives_its_ttl(limiter: tuple[RateLimiter, Keys]) -> None:
    """A stream whose gateway renews its lease keeps its slot past the lease time."""
    lim, _ = limiter
    limits = Limits(key_streams=1)
    await lim.admit(
        job_id="s", key_id="k", tenant_id="t", limits=limits, tokens=1, prompt_estimate=0
    )
    for _ in range(4):
        await asyncio.sleep(0.4)
        await lim.renew()
    assert not await _admit(lim, limits)


async def test_revoked_marker_refuses_admission(
    services: Services, limiter: tuple[RateLimiter, Keys]
) -> None:
    """Once the key's revoked marker exists, the admission script refuses it."""
    lim, keys = limiter
    r = aioredis.Redis.from_url(services.redis_url)
    await r.set(keys.key_revoked("k"), "1")
    await r.aclose()
    with pytest.raises(Unauthorized):
        await lim.admit(
            job_id="x", key_id="k", tenant_id="t", limits=Limits(), tokens=1, prompt_estimate=0
        )


def _settings(stack: Stack) -> Settings:
    return load_settings(
        database_url=stack.services.database_url,
        redis_url=stack.services.redis_url,
        redis_prefix=stack.prefix,
    )


async def _chat_outcome(url: str, key: str, chat_id: str) -> dict[str, Any]:
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "id": chat_id,
                    "messages": [{"role": "user", "content": "count me"}],
                    "max_tokens": 2,
                }
            )
        )
        return dict(json.loads(await asyncio.wait_for(ws.recv(), 20)))


async def test_three_gateways_admit_exactly_the_key_rpm(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Three gateway processes, one Redis, a 100 rpm key, 300 chats spread over them: 100 pass."""
    # A 1 s heartbeat: the shared 0.3 s one reads as "no chat worker" on a loaded machine.
    with make_stack(
        services, migrated, tmp_path_factory.mktemp("rl"), bulk=False, worker_heartbeat_s="1"
    ) as stack:
        created = await create_key(
            _settings(stack), f"rl-{uuid.uuid4().hex[:6]}", rpm=100, tpm=0, max_streams=0
        )
        ports = [stack.gateway_port]
        for i in (1, 2):
            port = free_port()
            stack.start(f"gateway{i}", ["-m", "gateway", "--port", str(port)])
            ports.append(port)
        for port in ports:
            wait_until(lambda p=port: port_open(p), 20, what="gateway")  # type: ignore[misc]
        stack.wait_ready()
        urls = [f"ws://127.0.0.1:{p}/v1/ws" for p in ports]
        sem = asyncio.Semaphore(60)

        async def one(i: int) -> dict[str, Any]:
            async with sem:
                return await _chat_outcome(urls[i % 3], created.key, f"c{i}")

        frames = await asyncio.gather(*(one(i) for i in range(300)))
        accepted = [f for f in frames if f["type"] == "accepted"]
        limited = [f for f in frames if f.get("code") == "rate_limited"]
        assert len(accepted) == 100, [f for f in frames if f["type"] != "accepted"][:3]
        assert len(limited) == 200, [f for f in frames if f.get("code") != "rate_limited"][:3]
        assert all(0 < f["retry_after_ms"] <= 60_000 for f in limited)


async def test_redis_out_of_reach_refuses_the_chat_as_overloaded_with_a_retry_hint(
    tmp_path: Path,
) -> None:
    """Redis stopped: an admission waits at most the limiter's timeout, then `overloaded` with
    retry_after_ms; once Redis has been gone past the pipe's limit, at once."""
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    pipe = RedisPipe(f"redis://127.0.0.1:{port}/0", down_fail_s=1.0)
    await pipe.start()
    lim = RateLimiter(pipe, Keys("ftrl-down"), lease_s=1.0, timeout_s=0.3)

    async def admit() -> None:
        await lim.admit(
            job_id=uuid.uuid4().hex, key_id="k", tenant_id="t", limits=Limits(), tokens=1,
            prompt_estimate=0,
        )  # fmt: skip

    try:
        await admit()
        server.terminate()
        server.wait(10)
        deadline = asyncio.get_running_loop().time() + 5
        while pipe.connected:
            assert asyncio.get_running_loop().time() < deadline, "the pipe missed Redis going"
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match=r"did not answer within 0\.3s") as waited:
            await admit()
        await asyncio.sleep(1.0)
        with pytest.raises(Overloaded, match="cannot reach Redis") as refused:
            await admit()
        for info in (waited, refused):
            assert info.value.retry_after_ms == 1000
            assert "retry shortly" in info.value.message
    finally:
        await pipe.close(grace_s=0.1)
        server.terminate()
        server.wait(10)
