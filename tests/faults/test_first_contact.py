"""Issue 42 ("first contact"), the faults: the only chat worker killed, a chat already queued
and a new one on each door end `overloaded` with a retry hint within the heartbeat loss (2 s
here), not the queue deadline; a Redis outage logged as one line per loop when it starts and
one when it ends, no traceback."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
import websockets

from firsttoken.openaiclient import base_url
from tests.integration.conftest import Client, Services, make_stack
from tests.support import free_port, throwaway_redis_server

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def _overloaded(frame: dict[str, Any]) -> None:
    assert frame["type"] == "error" and frame["code"] == "overloaded", frame
    assert frame["retry_after_ms"] >= 1000, frame


async def test_no_live_chat_worker_means_overloaded_within_the_heartbeat_loss_on_both_doors(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """Queue deadline 10 s, as shipped: the queued chat and the new ones are refused in ~2 s."""
    with make_stack(
        services, migrated, tmp_path, bulk=False, queue_deadline_s="10", worker_lost_after_s="2"
    ) as stack:
        stack.wait_ready()
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
            client = Client(ws)
            await client.chat("warm")
            assert (await client.until_end("warm"))[1]["type"] == "done"

            stack.procs["chat0"].kill()
            killed = time.monotonic()
            # Sent while the dead worker's last beat is still fresh: admitted, then queued.
            await client.chat("queued")
            _, end = await client.until_end("queued", timeout=8)
            _overloaded(end)
            assert time.monotonic() - killed < 3.5, "the queued chat waited for its deadline"

            sent = time.monotonic()
            await client.chat("new")
            _, end = await client.until_end("new", timeout=5)
            _overloaded(end)
            assert time.monotonic() - sent < 1.0

        sdk = openai.AsyncOpenAI(
            base_url=base_url(stack.http), api_key=stack.api_key, max_retries=0
        )
        try:
            sent = time.monotonic()
            with pytest.raises(openai.InternalServerError) as refused:
                await sdk.chat.completions.create(
                    model="auto", messages=[{"role": "user", "content": "anyone?"}], stream=True
                )
            assert time.monotonic() - sent < 1.0
            assert refused.value.status_code == 503
            assert int(refused.value.response.headers["retry-after"]) >= 1
            error = refused.value.response.json()["error"]
            assert error["code"] == "overloaded" and error["type"] == "server_error"
            assert set(error) == {"message", "type", "param", "code"}
        finally:
            await sdk.close()


# "... WARNING shared.redis.pipe: Redis pipe: Redis unreachable" (gateway) or
# "[...: WARNING/MainProcess] heartbeat: Redis unreachable" (Celery's format).
OUTAGE_LINE = re.compile(
    r"WARNING(?: \S+:|/\w+\]) ([^:\n]+): Redis (unreachable|still unreachable|reachable again)"
)


async def test_a_redis_outage_is_one_line_per_loop_at_each_end_and_no_traceback(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """Redis stopped for 8 s under a gateway, a chat worker and a bulk worker: each loop that
    polls Redis says so once when it starts failing and once when it is back; no traceback."""
    port = free_port()
    procs = [throwaway_redis_server(port, tmp_path)]
    on_own = Services(f"redis://127.0.0.1:{port}/0", services.database_url, [])
    try:
        with make_stack(on_own, migrated, tmp_path) as stack:
            stack.wait_ready()
            stack.wait_worker("bulk", "bulk")
            before = {name: len(proc.output()) for name, proc in stack.procs.items()}
            procs[-1].terminate()
            procs[-1].wait(10)
            await asyncio.sleep(8)
            procs.append(throwaway_redis_server(port, tmp_path))
            stack.wait_ready()
            await asyncio.sleep(3)  # every loop's next try, after the longest backoff
            said: dict[str, Counter[tuple[str, str]]] = {}
            for name in ("gateway", "chat0", "bulk"):
                new = stack.procs[name].output()[before[name] :]
                assert "Traceback" not in new, f"{name}:\n{new[-3000:]}"
                said[name] = Counter(OUTAGE_LINE.findall(new))
                starts = {loop for (loop, kind) in said[name] if kind == "unreachable"}
                ends = {loop for (loop, kind) in said[name] if kind == "reachable again"}
                assert starts and starts == ends, (name, said[name])
                assert all(count == 1 for count in said[name].values()), (name, said[name])
            assert ("heartbeat", "unreachable") in said["chat0"]
            assert ("pub/sub", "unreachable") in said["gateway"]
    finally:
        procs[-1].terminate()
        procs[-1].wait(10)
