"""Cost of authentication + rate-limit admission per chat, and its share of the added TTFT.

    python scripts/bench_admission.py [--n 3000] [--runs 5] [--chats 200]

Measures, against the machine's Redis and PostgreSQL, in one process:
  auth_cached   Authenticator.authenticate() with the key in the in-process cache (per connection)
  auth_redis    the same after the cache lapsed: one Redis GET (at most once a second per key)
  admission     what start_chat adds per chat: prompt estimate + reservation + one EVALSHA
Then starts a real stack (sim engine, a chat worker, a gateway) and runs sequential chats to get
the stack's added first-token latency: ttft_ms (gateway received -> first chunk sent) minus
engine_ttft_ms (the engine's own time to first token), as reported in each `done` frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis
import websockets

from gateway.auth import Authenticator
from gateway.ratelimit import RateLimiter
from shared.db.apikeys import create_tenant_and_key
from shared.db.migrate import upgrade
from shared.db.session import make_engine, make_sessionmaker
from shared.keys import Keys
from shared.limits import Limits, estimate_prompt_tokens, reservation
from shared.redispipe import RedisPipe
from tests.integration.conftest import Services, make_stack
from tests.support import REDIS_URL, postgres_database


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def micro(db_url: str, n: int) -> dict[str, list[float]]:
    engine = make_engine(db_url)
    async with make_sessionmaker(engine)() as session:
        _, _, key = await create_tenant_and_key(session, f"bench-{uuid.uuid4().hex[:6]}")
        await session.commit()
    keys = Keys(f"ftbench{uuid.uuid4().hex[:6]}")
    redis = aioredis.Redis(
        connection_pool=aioredis.BlockingConnectionPool.from_url(
            REDIS_URL, decode_responses=True, max_connections=16
        )
    )
    auth = Authenticator(redis, keys, make_sessionmaker(engine), 3600.0)
    pipe = RedisPipe(REDIS_URL)
    await pipe.start()
    limiter = RateLimiter(pipe, keys, 60)
    limits = Limits(
        key_rpm=10**9, key_tpm=10**12, key_streams=10**6, tenant_rpm=10**9, tenant_tpm=10**12
    )
    contents = ["You are helpful.", "What is the capital of France? Answer briefly."]
    out: dict[str, list[float]] = {"auth_cached": [], "auth_redis": [], "admission": []}
    principal = await auth.authenticate(key)  # warm: DB -> Redis -> cache
    for _ in range(200):
        await limiter.admit(
            job_id=uuid.uuid4().hex,
            key_id="w",
            tenant_id="w",
            limits=limits,
            tokens=1,
            prompt_estimate=0,
        )
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await auth.authenticate(key)
        out["auth_cached"].append((time.perf_counter_ns() - t0) / 1000)
    for _ in range(n):
        auth._cache.clear()
        t0 = time.perf_counter_ns()
        await auth.authenticate(key)
        out["auth_redis"].append((time.perf_counter_ns() - t0) / 1000)
    for _ in range(n):
        t0 = time.perf_counter_ns()
        est = estimate_prompt_tokens(contents)
        await limiter.admit(
            job_id=uuid.uuid4().hex,
            key_id=principal.key_id,
            tenant_id=principal.tenant_id,
            limits=limits,
            tokens=reservation(est, 64),
            prompt_estimate=est,
        )
        out["admission"].append((time.perf_counter_ns() - t0) / 1000)
    found = [k async for k in redis.scan_iter(f"{keys.prefix}:*")]
    if found:
        await redis.delete(*found)
    await pipe.close()
    await redis.aclose()
    await engine.dispose()
    return out


async def added_ttft(url: str, key: str, chats: int) -> list[float]:
    added = []
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(url, additional_headers=headers) as ws:
        for i in range(chats + 10):
            await ws.send(
                json.dumps(
                    {
                        "type": "chat",
                        "id": f"b{i}",
                        "cache": False,
                        "messages": [{"role": "user", "content": f"q {i}"}],
                        "max_tokens": 4,
                    }
                )
            )
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] in ("done", "error"):
                    break
            if frame["type"] == "done" and i >= 10:  # the first ten warm everything up
                t = frame["timings"]
                added.append(t["ttft_ms"] - t["engine_ttft_ms"])
    return added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000, help="calls per measurement per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chats", type=int, default=200, help="sequential chats for added TTFT")
    args = parser.parse_args()
    with postgres_database() as db_url:
        upgrade(db_url)
        runs = [asyncio.run(micro(db_url, args.n)) for _ in range(args.runs)]
        print(f"{'measure':12} {'p50 us (median of runs)':>24} {'p99 us (median of runs)':>24}")
        summary = {}
        for name in runs[0]:
            p50 = statistics.median(pct(r[name], 0.5) for r in runs)
            p99 = statistics.median(pct(r[name], 0.99) for r in runs)
            summary[name] = (p50, p99)
            print(f"{name:12} {p50:24.1f} {p99:24.1f}")
        with tempfile.TemporaryDirectory() as logs:
            services = Services(REDIS_URL, db_url, [])
            _, _, key = asyncio.run(_key(db_url))
            with make_stack(services, key, Path(logs), bulk=False) as stack:
                stack.wait_ready()
                added = asyncio.run(added_ttft(stack.ws_url, key, args.chats))
        a50, a99 = pct(added, 0.5), pct(added, 0.99)
        print(
            f"stack added first-token latency: p50 {a50:.2f} ms, p99 {a99:.2f} ms "
            f"({len(added)} sequential chats)"
        )
        per_chat = summary["admission"][0] + summary["auth_cached"][0]
        print(
            f"auth (cached) + admission p50 = {per_chat:.1f} us = "
            f"{100 * per_chat / (a50 * 1000):.1f}% of the added p50"
        )
    return 0


async def _key(db_url: str) -> tuple[str, str, str]:
    engine = make_engine(db_url)
    try:
        async with make_sessionmaker(engine)() as session:
            result = await create_tenant_and_key(
                session, f"bench-{uuid.uuid4().hex[:6]}", rpm=0, tpm=0, max_streams=0
            )
            await session.commit()
            return result
    finally:
        await engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
