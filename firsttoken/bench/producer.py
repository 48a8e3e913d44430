"""A stand-in for the chat workers that costs next to nothing per token: it takes chat jobs off
the chat queue and publishes, for each, exactly the messages a chat worker publishes
(workers/chat/publish.py): a `started` chunk, token chunks with contiguous `seq` and a fixed text,
then a `done` chunk with usage, each to the job's pub/sub channel and its replay stream. No
engine, no Celery, no retrieval: what is left to measure is the gateway's relay.

    python -m firsttoken.bench.producer --name p0 --token-rate 100 --tokens-per-frame 1

The answer has `max_tokens` tokens (the chat frame's), sent at `--token-rate` tokens/s per
stream, `--tokens-per-frame` tokens per chunk (a fraction spreads them: 1.5 sends 1, 2, 1,
2, ...). The relay bench (`firsttoken.bench.relaythroughput`) overrides both per load point
through the hash at :func:`config_key`, read every 0.25 s.

Cheap by construction: one scheduler per process sends every chunk that is due across all of
its jobs in one socket write per tick, as hand-packed RESP on a connection
(shared/redis/connection.py) with `CLIENT REPLY OFF` (no replies to read); token chunks are
built from a per-job template, checked once per job against `shared.protocol`'s own encoders.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from shared.keys import CHAT_QUEUE, Keys
from shared.protocol import (
    CHUNK_DONE,
    CHUNK_STARTED,
    CHUNK_TOKEN,
    done_chunk,
    dumps,
    encode_chunk,
    encode_started,
    encode_token,
)
from shared.redis.client import redis_client
from shared.redis.connection import RedisConnection
from shared.redis.resp import bulks, pack
from shared.settings import get_settings

TOKEN_TEXT = " tok"  # every token's text; a frame of k tokens carries it k times
DEFAULT_MODEL = "relay-bench"


def config_key(keys: Keys) -> str:
    """Hash the relay bench writes: token_rate, tokens_per_frame, ttft_ms (all optional)."""
    return f"{keys.prefix}:relaybench:config"


@dataclass(slots=True)
class Shape:
    """How an answer is sent: its pace and its framing."""

    token_rate: float = 100.0  # tokens/s per stream; 0: every chunk at the first tick
    tokens_per_frame: float = 1.0
    ttft_ms: float = 0.0

    def frame_sizes(self, tokens: int) -> list[int]:
        """Tokens in each chunk of a `tokens`-token answer (sum == tokens, each >= 1)."""
        k = max(1.0, self.tokens_per_frame)
        sizes, sent = [], 0
        j = 1
        while sent < tokens:
            upto = min(tokens, max(sent + 1, math.floor(j * k + 1e-9)))
            sizes.append(upto - sent)
            sent = upto
            j += 1
        return sizes


def resp(*args: str | bytes | int) -> bytes:
    """One Redis command in RESP (shared/redis/resp.py's `pack` of mixed arguments)."""
    return pack([a if isinstance(a, bytes) else str(a).encode() for a in args])


class ProducerJob:
    """One chat's chunks, pre-packed: PUBLISH + XADD per message, as the worker sends them."""

    __slots__ = (
        "_pub",
        "_stream",
        "_tok_head",
        "_xadd",
        "chat_id",
        "done_at",
        "due",
        "frame_texts",
        "job",
        "points",
        "prompt_tokens",
        "sent",
        "sizes",
        "t0",
    )

    def __init__(
        self, job: dict[str, Any], keys: Keys, shape: Shape, maxlen: int, now: float
    ) -> None:
        self.job = job
        self.chat_id = str(job["chat_id"])
        job_id = str(job["job_id"])
        channel = keys.job_channel(job_id).encode()
        stream = self._stream = keys.replay_stream(job_id).encode()
        self._pub = b"*3\r\n$7\r\nPUBLISH\r\n" + bulks((channel,))
        self._xadd = b"*8\r\n$4\r\nXADD\r\n" + bulks(
            (stream, b"MAXLEN", b"~", str(maxlen).encode(), b"*", b"m")
        )
        # encode_token(chat_id, seq, text) == head + str(seq) + tail; checked below.
        self._tok_head = '{"type":"token","id":' + json.dumps(self.chat_id, ensure_ascii=False)
        self._tok_head += ',"seq":'
        self.sizes = shape.frame_sizes(int(job["max_tokens"]))
        tails = {
            n: ',"text":' + json.dumps(TOKEN_TEXT * n, ensure_ascii=False) + "}"
            for n in set(self.sizes)
        }
        self.frame_texts = [tails[n] for n in self.sizes]
        for seq in {0, len(self.sizes) - 1} if self.sizes else ():
            real = encode_chunk(
                CHUNK_TOKEN, encode_token(self.chat_id, seq, TOKEN_TEXT * self.sizes[seq]), seq
            )
            if self.token_chunk(seq) != real.encode():
                raise AssertionError("token template differs from shared.protocol.encode_token")
        self.sent = 0
        self.prompt_tokens = 0
        self.t0 = now + shape.ttft_ms / 1000.0
        # due[j]: monotonic time chunk j is due (the time its last token is "generated").
        rate = shape.token_rate
        cum = 0
        self.due: list[float] = []
        for n in self.sizes:
            cum += n
            self.due.append(self.t0 + ((cum - 1) / rate if rate > 0 else 0.0))
        self.done_at = self.due[-1] if self.due else self.t0
        self.points: dict[str, float] = {
            "received": float(job["received_at"]),
            "enqueued": float(job["enqueued_at"]),
        }

    def token_chunk(self, seq: int) -> bytes:
        return f"T{seq}\n{self._tok_head}{seq}{self.frame_texts[seq]}".encode()

    def command(self, message: bytes) -> bytes:
        """PUBLISH + XADD of one message, as workers/chat/publish.py sends it."""
        body = bulks((message,))
        return self._pub + body + self._xadd + body

    def started(self, wall: float, ttl: int) -> bytes:
        """The `started` chunk and the replay stream's expiry (JobPublisher.start)."""
        message = encode_chunk(CHUNK_STARTED, encode_started(wall)).encode()
        self.points["worker_start"] = wall
        return self.command(message) + resp("EXPIRE", self._stream, ttl)

    def done(self, wall: float, model: str, prompt_tokens: int) -> bytes:
        """The `done` control chunk, built as the chat worker builds it."""
        self.points["finished"] = wall
        chunk = done_chunk(
            self.chat_id,
            cached=False,
            model=model,
            finish_reason="length",
            usage={"prompt_tokens": prompt_tokens, "completion_tokens": sum(self.sizes)},
            chunks=self.sent,
            points=self.points,
        )
        return self.command(encode_chunk(CHUNK_DONE, dumps(chunk)).encode())


def parse_task(raw: str | bytes) -> dict[str, Any]:
    """The chat job dict out of the kombu envelope the gateway LPUSHes (shared/tasks.py)."""
    envelope = json.loads(raw)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    _args, kwargs, _embed = json.loads(body)
    job: dict[str, Any] = kwargs["job"]
    return job


async def _open_raw(url: str) -> RedisConnection:
    """A connection to Redis that sends commands and never reads a reply."""
    conn = await RedisConnection.open(url, client_name="firsttoken-bench-producer")
    conn.write(resp("CLIENT", "REPLY", "OFF"))
    await conn.drain()
    return conn


@dataclass
class Producer:
    name: str
    shape: Shape
    tick_s: float = 0.002
    model: str = DEFAULT_MODEL
    jobs: list[ProducerJob] = field(default_factory=list)
    out: list[bytes] = field(default_factory=list)
    completed: int = 0

    def __post_init__(self) -> None:
        self.settings = get_settings()
        self.keys = Keys(self.settings.redis_prefix)
        self.redis = redis_client(self.settings.redis_url)
        self._wake = asyncio.Event()

    async def run(self) -> None:
        conn = await _open_raw(self.settings.redis_url)
        tasks = [
            asyncio.create_task(self._heartbeat()),
            asyncio.create_task(self._take_jobs()),
            asyncio.create_task(self._follow_config()),
        ]
        try:
            await self._send_loop(conn)
        finally:
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                await self.redis.zrem(self.keys.worker_heartbeats(CHAT_QUEUE), self.name)
            await conn.aclose()
            await self.redis.aclose()

    async def _heartbeat(self) -> None:
        key = self.keys.worker_heartbeats(CHAT_QUEUE)
        while True:
            await self.redis.zadd(key, {self.name: time.time()})
            await asyncio.sleep(self.settings.worker_heartbeat_s)

    async def _follow_config(self) -> None:
        key = config_key(self.keys)
        while True:
            cfg = await self.redis.hgetall(key)
            if cfg:
                self.shape = Shape(
                    float(cfg.get("token_rate", self.shape.token_rate)),
                    float(cfg.get("tokens_per_frame", self.shape.tokens_per_frame)),
                    float(cfg.get("ttft_ms", self.shape.ttft_ms)),
                )
            await asyncio.sleep(0.25)

    async def _take_jobs(self) -> None:
        from gateway.rates import estimate_prompt_tokens

        queue = self.keys.queue_list(CHAT_QUEUE)
        ttl, maxlen = self.settings.replay_ttl_s, self.settings.replay_maxlen
        while True:
            item = await self.redis.brpop([queue], timeout=1)
            if item is None:
                continue
            job = parse_task(item[1])
            pj = ProducerJob(job, self.keys, self.shape, maxlen, time.monotonic())
            pj.prompt_tokens = estimate_prompt_tokens(m["content"] for m in job["messages"])
            self.out.append(pj.started(time.time(), ttl))
            self.jobs.append(pj)
            self._wake.set()

    async def _send_loop(self, conn: RedisConnection) -> None:
        while True:
            if not self.jobs and not self.out:
                self._wake.clear()
                await self._wake.wait()
            now = time.monotonic()
            wall = time.time()
            out = self.out
            keep: list[ProducerJob] = []
            for pj in self.jobs:
                due, seq, n = pj.due, pj.sent, len(pj.due)
                while seq < n and due[seq] <= now:
                    out.append(pj.command(pj.token_chunk(seq)))
                    seq += 1
                if seq and not pj.sent:
                    pj.points["engine_first_token"] = wall
                    pj.points["first_chunk_published"] = wall
                pj.sent = seq
                if seq == n:
                    model = pj.job.get("model") or self.model
                    out.append(pj.done(wall, model, pj.prompt_tokens))
                    self.completed += 1
                else:
                    keep.append(pj)
            self.jobs = keep
            if out:
                conn.write(b"".join(out))
                out.clear()
                await conn.drain()
            await asyncio.sleep(self.tick_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m firsttoken.bench.producer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--name",
        default=f"relay-producer-{os.getpid()}@{socket.gethostname()}",
        help="heartbeat name (what gateways count as a live chat worker)",
    )
    p.add_argument(
        "--token-rate",
        type=float,
        default=100.0,
        help="tokens/s per stream (0: send each answer at once). Default %(default)s",
    )
    p.add_argument(
        "--tokens-per-frame",
        type=float,
        default=1.0,
        help="tokens per token chunk, >= 1; fractions spread (default %(default)s)",
    )
    p.add_argument(
        "--ttft-ms",
        type=float,
        default=0.0,
        help="delay from pickup to the first token (default %(default)s)",
    )
    p.add_argument(
        "--tick-ms",
        type=float,
        default=2.0,
        help="scheduler tick: chunks due within one tick go out in one write (default %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape = Shape(args.token_rate, args.tokens_per_frame, args.ttft_ms)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        run(Producer(args.name, shape, tick_s=args.tick_ms / 1000.0).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
