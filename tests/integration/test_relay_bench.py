"""The relay bench's producer must publish what a chat worker publishes, or the bench measures
a relay that does not exist. Compared here against workers/chat/publish.py's JobPublisher on the
machine's Redis, then run through a real gateway to a websocket client, then the whole harness
at a tiny load."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from firsttoken.bench.producer import TOKEN_TEXT, ProducerJob, Shape, _open_raw, parse_task
from shared.keys import CHAT_QUEUE, CHAT_TASK, Keys
from shared.protocol import CHUNK_DONE, CHUNK_STARTED, CHUNK_TOKEN, decode_chunk
from shared.tasks import ChatJob, task_message
from tests.support import REDIS_URL, redis_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis"),
]

TOKENS = 7


def _job(keys: Keys, chat_id: str, max_tokens: int = TOKENS) -> dict[str, Any]:
    now = time.time()
    job = ChatJob(
        job_id=uuid.uuid4().hex,
        chat_id=chat_id,
        tenant_id="t",
        key_id="k",
        messages=[{"role": "user", "content": "hello there"}],  # type: ignore[list-item]
        max_tokens=max_tokens,
        received_at=now,
        enqueued_at=now,
        deadline_at=now + 10,
    )
    # Through the gateway's own envelope, so the parser is tested on the real thing.
    message = task_message(CHAT_TASK, {"job": job.model_dump()}, queue=CHAT_QUEUE)
    return parse_task(message)


async def _capture(client: aioredis.Redis, channel: str, send: Any, until_kind: str) -> list[str]:
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    await send()
    got: list[str] = []
    while not got or decode_chunk(got[-1])[0] != until_kind:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
        assert msg is not None, f"no more messages after {got}"
        got.append(msg["data"])
    await pubsub.aclose()
    return got


def test_producer_chunks_match_the_worker_publisher() -> None:
    from shared.redis import scripts
    from shared.redis.pipe import RedisPipe
    from workers.chat.publish import JobPublisher

    async def scenario() -> None:
        keys = Keys(f"ftrelay{uuid.uuid4().hex[:8]}")
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            worker_job = _job(keys, "chat-1")
            bench_job = _job(keys, "chat-1")
            # What a chat worker publishes for a 7-token answer, one token per chunk.
            sender = RedisPipe(REDIS_URL)
            chunks = sender.script(scripts.CHUNK_SEND)
            await sender.start()
            publisher = JobPublisher(
                chunks,
                keys,
                worker_job["job_id"],
                "chat-1",
                replay_maxlen=2000,
                replay_ttl_s=600,
            )

            async def worker_sends() -> None:
                publisher.start(time.time(), keys.cancel_flag(worker_job["job_id"]))
                for _ in range(TOKENS):
                    publisher.token(TOKEN_TEXT)
                publisher.control(CHUNK_DONE, json.dumps({"type": "done"}))
                await sender.close()

            worker = await _capture(
                client, keys.job_channel(worker_job["job_id"]), worker_sends, CHUNK_DONE
            )

            pj = ProducerJob(bench_job, keys, Shape(0, 1), 2000, time.monotonic())
            conn = await _open_raw(REDIS_URL)

            async def producer_sends() -> None:
                out = [pj.started(time.time(), 600)]
                out += [pj.command(pj.token_chunk(seq)) for seq in range(len(pj.sizes))]
                pj.sent = len(pj.sizes)
                out.append(pj.done(time.time(), "m", 3))
                conn.write(b"".join(out))
                await conn.drain()

            bench = await _capture(
                client, keys.job_channel(bench_job["job_id"]), producer_sends, CHUNK_DONE
            )
            await conn.aclose()

            # Same sequence of chunk kinds; token chunks byte for byte the worker's.
            assert [decode_chunk(m)[0] for m in bench] == [decode_chunk(m)[0] for m in worker]
            assert [decode_chunk(m)[0] for m in bench] == (
                [CHUNK_STARTED] + [CHUNK_TOKEN] * TOKENS + [CHUNK_DONE]
            )
            assert bench[1:-1] == worker[1:-1]
            assert json.loads(decode_chunk(bench[0])[2]).keys() == {"t"}
            assert json.loads(decode_chunk(worker[0])[2]).keys() == {"t"}
            done = json.loads(decode_chunk(bench[-1])[2])
            assert done["usage"] == {"prompt_tokens": 3, "completion_tokens": TOKENS}
            assert done["chunks"] == TOKENS and done["id"] == "chat-1"
            # The replay stream holds the same messages, and expires, as the worker's does.
            for job, sent in ((worker_job, worker), (bench_job, bench)):
                stream = keys.replay_stream(job["job_id"])
                entries = await client.xrange(stream)
                assert [fields["m"] for _, fields in entries] == sent
                assert 0 < await client.ttl(stream) <= 600
        finally:
            keys_left = [k async for k in client.scan_iter(f"{keys.prefix}:*")]
            if keys_left:
                await client.delete(*keys_left)
            await client.aclose()

    asyncio.run(scenario())


def test_frames_of_a_fraction_add_up() -> None:
    assert Shape(tokens_per_frame=1).frame_sizes(3) == [1, 1, 1]
    assert Shape(tokens_per_frame=4).frame_sizes(10) == [4, 4, 2]
    sizes = Shape(tokens_per_frame=1.5).frame_sizes(9)
    assert sum(sizes) == 9 and sizes == [1, 2, 1, 2, 1, 2]


def test_one_job_through_a_real_gateway() -> None:
    """Producer -> gateway -> websocket: contiguous seq, the whole text, `done` with usage."""
    import websockets

    from firsttoken.bench.stack import BenchStack

    stack = BenchStack(None, workers=0)
    try:
        stack.start_stack(
            chat_consumers={
                "producer0": [
                    "-m",
                    "firsttoken.bench.producer",
                    "--tokens-per-frame",
                    "2",
                    "--token-rate",
                    "2000",
                ]
            }
        )

        async def chat() -> list[dict[str, Any]]:
            frames: list[dict[str, Any]] = []
            async with websockets.connect(
                stack.ws_url, additional_headers={"Authorization": f"Bearer {stack.api_key}"}
            ) as ws:
                await ws.send(
                    json.dumps(
                        {
                            "type": "chat",
                            "id": "c1",
                            "cache": False,
                            "max_tokens": 9,
                            "messages": [{"role": "user", "content": "hi"}],
                        }
                    )
                )
                while not frames or frames[-1]["type"] not in ("done", "error"):
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return frames

        frames = asyncio.run(chat())
    except BaseException:
        stack.keep_workdir = True
        raise
    finally:
        stack.close()
    assert frames[0]["type"] == "accepted"
    tokens = [f for f in frames if f["type"] == "token"]
    assert [t["seq"] for t in tokens] == list(range(5))  # 9 tokens, 2 a frame
    assert all(t["id"] == "c1" for t in tokens)
    assert "".join(t["text"] for t in tokens) == TOKEN_TEXT * 9
    done = frames[-1]
    assert done["type"] == "done", done
    assert done["usage"]["completion_tokens"] == 9 and done["usage"]["prompt_tokens"] > 0
    assert {"queue_ms", "relay_ms", "ttft_ms", "total_ms"} <= set(done["timings"])


def test_relay_harness_tiny_run(tmp_path: Path) -> None:
    from firsttoken.bench.relaythroughput import main

    out = tmp_path / "relay.json"
    rc = main(
        [
            "--streams", "4", "--tokens", "16", "--token-rate", "400",
            "--tokens-per-frame", "1,4", "--producers", "1", "--duration", "1",
            "--warmup", "0.3", "--repeats", "1", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert [r["tokens_per_frame"] for r in data["runs"]] == [1.0, 4.0]
    for run in data["runs"]:
        assert run["errors"] == {} and run["ok"] > 0
        assert run["tokens"] > 0 and run["tokens_per_s"] > 0
        # Frames per token as the producer framed them (the last frame of 16 at 4 is full).
        assert run["tokens"] == run["frames"] * run["tokens_per_frame"]
        assert {"gateway", "producers", "client", "redis"} <= set(run["cpu"])
    assert len(data["summary"]) == 2
