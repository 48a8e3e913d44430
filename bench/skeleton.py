"""The floor of the stack's process layout: its hops with none of its logic.

    python bench/skeleton.py [--requests 96] [--repeats 2]

Starts the simulator (the `on-the-bench` profile) and a skeleton of firsttoken on its path:
a gateway (uvicorn on uvloop, httptools and websockets-sansio, as gateway/__main__.py runs it;
a bare ASGI app, no Starlette) that takes a chat off a websocket frame or a `POST
/v1/chat/completions`, subscribes to a channel and LPUSHes a job; a worker (uvloop) that BRPOPs
the job, streams it from the simulator with the chat worker's own HTTP client
(workers/engines/httpstream.py) and PUBLISHes every token already encoded for the client's door
(a websocket frame or a server-sent event); the gateway writes each message to its client as it
comes. No admission, no validation, no lease, no replay stream, no coalescing, no accounting.

Then runs `firsttoken bench` with `--url` and `--engine-url` against the two, in the shape of
issue 43's one-stream row: each request at random straight to the simulator, through the
websocket or through the HTTP door, one after another. The added TTFT it prints is what the
process layout alone costs on this machine: client -> gateway -> Redis -> worker -> engine ->
worker -> Redis -> gateway -> client, against client -> engine -> client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import hiredis
import orjson

REDIS = ("127.0.0.1", 6379)
QUEUE = b"firsttoken-skeleton:queue"
SSE_DONE = b"data: [DONE]\n\n"
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _command(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _Redis(asyncio.Protocol):
    """One connection: commands written as they come, replies handed to `on_reply` in order."""

    def __init__(self, on_reply: Any = None) -> None:
        self.reader = hiredis.Reader()
        self.on_reply = on_reply
        self.transport: asyncio.Transport | None = None
        self.ready = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if self.on_reply is not None:
                self.on_reply(reply)

    def send(self, *args: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_command(*args))


async def _connect(on_reply: Any = None) -> _Redis:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: _Redis(on_reply), *REDIS)
    await proto.ready
    sock = proto.transport.get_extra_info("socket") if proto.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return proto


# --- the gateway ------------------------------------------------------------------------------


def gateway_app(late_headers: bool) -> Any:
    """`late_headers`: the HTTP door's headers go out with the first token (as firsttoken's door
    sends them, so that an error before it has its own status), not once the job is queued."""
    # channel -> (the websocket's send, or None; the HTTP response's event queue, or None)
    followers: dict[bytes, tuple[Any, asyncio.Queue[bytes] | None]] = {}
    conns: dict[str, _Redis] = {}

    pending: set[asyncio.Future[None]] = set()  # sends that had to wait for the socket

    def on_pubsub(reply: Any) -> None:
        if reply[0] != b"message":
            return
        follower = followers.get(reply[1])
        if follower is None:
            return
        send, sse = follower
        if sse:
            sse.put_nowait(reply[2])
            if reply[2] == SSE_DONE:
                del followers[reply[1]]
                conns["sub"].send(b"UNSUBSCRIBE", reply[1])
            return
        text = reply[2].decode()
        coro = send({"type": "websocket.send", "text": text})
        try:  # written in place, as the gateway's eager send does
            coro.send(None)
        except StopIteration:
            pass
        else:  # pragma: no cover - the socket was full: finish it on a task
            task = asyncio.ensure_future(_finish(coro))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if text.startswith('{"type":"done"'):
            del followers[reply[1]]
            conns["sub"].send(b"UNSUBSCRIBE", reply[1])

    async def _finish(coro: Any) -> None:
        await coro

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                conns["sub"] = await _connect(on_pubsub)
                conns["cmd"] = await _connect()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "http":
            await http_door(scope, receive, send)
            return
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = orjson.loads(message.get("text") or message.get("bytes"))
            enqueue(frame["id"], frame["messages"], send, None)

    def enqueue(chat_id: str, messages: Any, send: Any, sse: asyncio.Queue[bytes] | None) -> None:
        channel = b"firsttoken-skeleton:%s" % uuid.uuid4().hex.encode()
        followers[channel] = (send, sse)
        conns["sub"].send(b"SUBSCRIBE", channel)
        job = {"channel": channel.decode(), "id": chat_id, "messages": messages, "sse": bool(sse)}
        conns["cmd"].send(b"LPUSH", QUEUE, orjson.dumps(job))

    async def http_door(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/v1/models":
            body = orjson.dumps({"object": "list", "data": [{"id": "sim", "object": "model"}]})
            await send({"type": "http.response.start", "status": 200, "headers": JSON})
            await send({"type": "http.response.body", "body": body})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        events: asyncio.Queue[bytes] = asyncio.Queue()
        enqueue("c", orjson.loads(raw)["messages"], send, events)
        if not late_headers:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
        event = await events.get()
        if late_headers:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
        while event != SSE_DONE:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            event = await events.get()
        await send({"type": "http.response.body", "body": event})

    return app


def run_gateway(port: int, late_headers: bool) -> None:
    import uvicorn

    uvicorn.run(
        gateway_app(late_headers),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        log_level="warning",
        lifespan="on",
    )


# --- the worker -------------------------------------------------------------------------------


async def _work(engine_url: str, max_tokens: int) -> None:
    from workers.engines.httpstream import HTTPStreamPool

    pool = HTTPStreamPool(engine_url, connect_timeout_s=5.0)
    head = pool.request_head(
        "/chat/completions",
        {"Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    jobs: asyncio.Queue[Any] = asyncio.Queue()
    pub = await _connect()
    blocking = await _connect(lambda reply: jobs.put_nowait(reply))

    async def answer(job: dict[str, Any]) -> None:
        channel, chat_id = job["channel"].encode(), job["id"]
        body = {"model": "sim", "messages": job["messages"], "stream": True}
        body["max_tokens"] = max_tokens
        response = await pool.post(head, orjson.dumps(body))
        seq = 0
        while (data := await response.next_data()) is not None:
            if data == b"[DONE]":
                break
            choices = orjson.loads(data).get("choices") or [{}]
            text = (choices[0].get("delta") or {}).get("content")
            if text:
                if job["sse"]:
                    chunk = {
                        "object": "chat.completion.chunk",
                        "choices": [{"delta": {"content": text}}],
                    }
                    message = b"data: %s\n\n" % orjson.dumps(chunk)
                else:
                    message = orjson.dumps(
                        {"type": "token", "id": chat_id, "seq": seq, "text": text}
                    )
                pub.send(b"PUBLISH", channel, message)
                seq += 1
        usage = {"completion_tokens": seq}
        if job["sse"]:
            last = {"object": "chat.completion.chunk", "choices": [], "usage": usage}
            pub.send(b"PUBLISH", channel, b"data: %s\n\n" % orjson.dumps(last))
            pub.send(b"PUBLISH", channel, SSE_DONE)
        else:
            done = {"type": "done", "id": chat_id, "usage": usage}
            pub.send(b"PUBLISH", channel, orjson.dumps(done))

    running: set[asyncio.Future[None]] = set()
    while True:
        blocking.send(b"BRPOP", QUEUE, b"0")
        reply = await jobs.get()
        task = asyncio.ensure_future(answer(orjson.loads(reply[1])))
        running.add(task)
        task.add_done_callback(running.discard)


def run_worker(engine_url: str, max_tokens: int) -> None:
    import uvloop

    uvloop.run(_work(engine_url, max_tokens))


# --- the run ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s:g}s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=96, help="requests per run, all modes")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--late-headers",
        action="store_true",
        help="the HTTP door sends its headers with the first token, not once the job is queued",
    )
    p.add_argument("--role", choices=["gateway", "worker"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--engine-url", help=argparse.SUPPRESS)
    args = p.parse_args()
    from firsttoken.bench.profiles import PROFILES

    profile = PROFILES["on-the-bench"]
    if args.role == "gateway":
        run_gateway(args.port, args.late_headers)
        return
    if args.role == "worker":
        run_worker(args.engine_url, profile.max_tokens)
        return
    sim_port, gw_port = _free_port(), _free_port()
    engine_url = f"http://127.0.0.1:{sim_port}/v1"
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "firsttoken.simserver",
                "--port",
                str(sim_port),
                *profile.sim_args(),
            ]
        ),
        subprocess.Popen(
            [*me, "--role", "gateway", "--port", str(gw_port)]
            + (["--late-headers"] if args.late_headers else [])
        ),
        subprocess.Popen([*me, "--role", "worker", "--engine-url", engine_url]),
    ]
    try:
        _wait_port(sim_port)
        _wait_port(gw_port)
        subprocess.run(
            [
                sys.executable, "-m", "firsttoken", "bench", "--no-progress",
                "--profile", "on-the-bench", "--modes", "direct,stack,openai", "--interleave",
                "--concurrency", "1", "--requests", str(args.requests),
                "--repeats", str(args.repeats), "--wait-idle", "30", "--wait-idle-max", "20",
                "--url", f"ws://127.0.0.1:{gw_port}/v1/ws", "--api-key", "skeleton",
                "--engine-url", engine_url,
            ],
            check=True,
        )  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    main()
