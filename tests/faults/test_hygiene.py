"""Input and text hygiene on the real stack (issue 29): NUL in a conversation turn, no prompt or
answer text in any log line at DEBUG, strict wire types, and slow request headers cut.

The engine is a tiny OpenAI-compatible server of the test's own (a thread): its answer carries
a NUL and a sentinel phrase of its own, so the answer's text can be looked for in the logs as
the prompt's is."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from shared.db.models import MessageRow
from shared.keys import BULK_QUEUE, CHAT_QUEUE, CHAT_TASK, PERSIST_MESSAGES_TASK, Keys
from shared.tasks import task_message
from tests.integration.conftest import Services, Stack, make_stack
from tests.integration.issue5 import ask, client, new_tenant, scalar
from tests.support import port_open, wait_until

PROMPT_SENTINEL = "quokka-" + uuid.uuid4().hex[:12]
ANSWER_SENTINEL = "narwhal-" + uuid.uuid4().hex[:12]
HEADER_TIMEOUT_S = 2.0


class _Engine(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: an answer with a NUL and the answer sentinel, streamed."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "sim"}
        deltas = [f"Noted {ANSWER_SENTINEL}", " with a \u0000 in it", "."]
        events = [{**head, "choices": [{"index": 0, "delta": {"content": t}}]} for t in deltas]
        events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        events.append(
            {**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
        )
        for event in events:
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def hygiene(
    services: Services, migrated: str, engine_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Chat and bulk workers at Celery's DEBUG, the gateway at DEBUG, text stored, a short
    header deadline, the test's own engine."""
    logs = tmp_path_factory.mktemp("hygiene-logs")
    with make_stack(
        services,
        migrated,
        logs,
        workers=0,
        bulk=False,
        gateway=False,
        log_level="DEBUG",
        store_text="true",
        http_header_timeout_s=str(HEADER_TIMEOUT_S),
        cache_semantic="false",
    ) as stack:
        stack.settings["engine_url"] = engine_url
        for name, queue in (("chat0", CHAT_QUEUE), ("bulk", BULK_QUEUE)):
            stack.start(
                name,
                ["-m", "firsttoken", "worker", "--queues", queue, "--loglevel", "debug",
                 "--name", f"{stack._worker_name(name)}%h"],
            )  # fmt: skip
        stack.start_gateway()
        stack.wait_ready()
        stack.wait_worker("chat0")
        yield stack


async def test_a_turn_with_nul_is_stored_and_the_next_turn_works(hygiene: Stack) -> None:
    """User text and engine answer with U+0000: the turn is stored with U+FFFD in its place
    (PostgreSQL text cannot hold NUL) and the conversation's next turn is answered."""
    _, _, key = await new_tenant(hygiene.services.database_url)
    c = await client(hygiene, key)
    try:
        first = await ask(c, "n1", f"nul \u0000 here {PROMPT_SENTINEL}", conversation_id="new")
        assert first["type"] == "done", first
        conv_id = first["conversation_id"]
        second = await ask(c, "n2", f"and again {PROMPT_SENTINEL}", conversation_id=conv_id)
        assert second["type"] == "done", second
        assert second["prompt"]["history_sent"] >= 2, second
    finally:
        await c.ws.close()
    rows = await scalar(
        hygiene.services.database_url,
        select(MessageRow.content)
        .where(MessageRow.conversation_id == conv_id)
        .order_by(MessageRow.id)
        .limit(1),
    )
    assert rows == f"nul \ufffd here {PROMPT_SENTINEL}"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"cache": "yes"}, "cache"),
        ({"temperature": "0.5"}, "temperature"),
    ],
)
async def test_the_gateway_refuses_coercible_wire_types(
    hygiene: Stack, extra: dict[str, Any], field: str
) -> None:
    """A string for a number, a number or string for a boolean: `invalid_request` naming the
    field, and the connection keeps working."""
    c = await client(hygiene, hygiene.api_key)
    try:
        await c.chat("w1", "hi", **extra)
        frame = await c.next_for("w1")
        assert frame["type"] == "error" and frame["code"] == "invalid_request", frame
        assert f"{field}: " in frame["message"], frame
        await c.send({"type": "ping", "id": "p"})
        assert (await c.next_for("p"))["type"] == "pong"
    finally:
        await c.ws.close()


async def test_no_prompt_or_answer_text_in_any_log_at_debug(hygiene: Stack) -> None:
    """A chat, a conversation turn, a chat job and a message write that do not validate: the
    prompt's and the answer's sentinels appear in no line of the gateway's or workers' logs."""
    c = await client(hygiene, hygiene.api_key)
    try:
        await c.chat("s1", f"plain chat {PROMPT_SENTINEL}")
        tokens, done = await c.until_end("s1")
        assert done["type"] == "done", done
        assert ANSWER_SENTINEL in "".join(t["text"] for t in tokens)
        await c.chat("s2", f"turn {PROMPT_SENTINEL}", conversation_id="new")
        _, done = await c.until_end("s2")
        assert done["type"] == "done", done
    finally:
        await c.ws.close()
    keys = Keys(hygiene.prefix)
    text = [{"role": "user", "content": f"bad {PROMPT_SENTINEL}"}]
    bad_job = {"job": {"job_id": "x", "messages": text}}  # missing fields
    bad_turn = {"messages": {"request_id": "x", "messages": text, "answer": ANSWER_SENTINEL}}
    with hygiene.redis() as r:
        r.lpush(keys.queue_list(CHAT_QUEUE), task_message(CHAT_TASK, bad_job, queue=CHAT_QUEUE))
        r.lpush(
            keys.queue_list(BULK_QUEUE),
            task_message(PERSIST_MESSAGES_TASK, bad_turn, queue=BULK_QUEUE),
        )
        # The bulk worker took it (and failed it) once its queue is empty.
        wait_until(lambda: r.llen(keys.queue_list(BULK_QUEUE)) == 0, 20, what="bulk queue")
    await asyncio.sleep(1.0)  # the failures' log lines
    outputs = {name: proc.output() for name, proc in hygiene.procs.items() if name != "sim"}
    assert "DEBUG" in outputs["chat0"] and "DEBUG" in outputs["bulk"], "not at DEBUG"
    assert "ValidationError" in outputs["bulk"], outputs["bulk"][-2000:]
    for name, output in outputs.items():
        for sentinel in (PROMPT_SENTINEL, ANSWER_SENTINEL):
            lines = [line for line in output.splitlines() if sentinel in line]
            assert not lines, f"{name}'s log holds chat text: {lines[:3]}"


def _slow_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def test_slow_headers_are_cut_while_a_chat_still_works(hygiene: Stack) -> None:
    """50 sockets sending their headers a byte a second are all closed by the gateway within
    the header deadline plus slack; a websocket chat meanwhile is answered."""
    loop = asyncio.get_running_loop()
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"s" * 200 + b"\r\n\r\n"
    socks = [_slow_client(hygiene.gateway_port) for _ in range(50)]
    start = time.monotonic()
    closed_at: dict[int, float] = {}

    async def trickle(i: int, sock: socket.socket) -> None:
        for byte in request:
            try:
                await loop.sock_sendall(sock, bytes([byte]))
                # A closed connection reads as EOF (or a reset) at once.
                data = await asyncio.wait_for(loop.sock_recv(sock, 1024), 1.0)
            except TimeoutError:
                continue
            except OSError:
                break
            if data == b"":
                break
            raise AssertionError(f"the gateway answered a request it never got whole: {data!r}")
        closed_at[i] = time.monotonic() - start

    try:
        trickling = asyncio.gather(*(trickle(i, s) for i, s in enumerate(socks)))
        c = await client(hygiene, hygiene.api_key)
        try:
            await c.chat("h1", "still there?")
            _, done = await c.until_end("h1")
            assert done["type"] == "done", done
        finally:
            await c.ws.close()
        await asyncio.wait_for(trickling, HEADER_TIMEOUT_S + 10)
    finally:
        for sock in socks:
            sock.close()
    assert len(closed_at) == 50
    assert max(closed_at.values()) < HEADER_TIMEOUT_S + 3, sorted(closed_at.values())[-5:]
    assert min(closed_at.values()) >= HEADER_TIMEOUT_S - 0.5
    assert port_open(hygiene.gateway_port)
