"""The chat pool is a Celery worker (workers/chat/pool.py), on the machine's Redis, with a real
worker process: Celery's control plane sees it (`inspect ping`, `active_queues` naming `chat`,
`stats` with its slots), chats run through it, `control shutdown` lets a running chat finish
before the process exits, and with task events on (`--events`) its chats reach an event
receiver as Celery task events."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import websockets
from kombu import Connection, Consumer, Queue

from firsttoken.procs import Child
from shared.keys import BULK_QUEUE, CHAT_TASK, Keys
from shared.tasks import ChatJob, new_id, task_message
from tests.integration.conftest import Client, Services, Stack, celery_chat_worker, make_stack
from tests.support import child_env, python_cmd
from workers.app import READ_ON_THE_LOOP, TaskConsumer

# A chat that streams for about two seconds: long enough to shut the worker down under it.
SLOW_SIM = ("--ttft-ms", "20", "--itl-ms", "50", "--max-tokens", "40")


def _celery(stack: Stack, *args: str, timeout: float = 60.0) -> str:
    """`celery -A workers.app ARGS` against the stack's broker prefix; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers.app", *args],
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.stdout + done.stderr


def _inspect(stack: Stack, node: str, command: str) -> Any:
    """The node's answer; asked again while it does not answer yet (at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        out = _celery(stack, "inspect", command, "-d", node, "-j", "-t", "5")
        start = out.find("{")
        if start >= 0 or time.monotonic() > deadline:
            break
    assert start >= 0, out
    return json.loads(out[start:])[node]


def _node(name: str, stack: Stack) -> str:
    return f"{name}-{stack.prefix}@{socket.gethostname()}"


async def _chat(stack: Stack, chat_id: str) -> tuple[Client, Any]:
    ws = await websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {stack.api_key}"}
    )
    client = Client(ws)
    await client.chat(chat_id, f"a question for the chat pool, {chat_id}")
    return client, ws


async def test_the_chat_pool_is_a_celery_worker_and_drains_on_control_shutdown(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    with make_stack(services, migrated, tmp_path, sim_args=SLOW_SIM) as s:
        s.wait_ready()
        s.wait_worker("chat0")
        node = _node("chat0", s)

        assert _inspect(s, node, "ping") == {"ok": "pong"}
        queues = _inspect(s, node, "active_queues")
        assert [q["name"] for q in queues] == ["chat"], queues
        stats = _inspect(s, node, "stats")
        assert stats["chat"]["slots"] > 0 and "solo" in stats["pool"]["implementation"]

        # A chat runs through it.
        client, ws = await _chat(s, "c1")
        async with ws:
            assert (await client.next_for("c1"))["type"] == "accepted"
            tokens, done = await client.until_end("c1", timeout=30)
            assert done["type"] == "done" and tokens, done
        assert _inspect(s, node, "stats")["chat"]["started"] == 1

        # A chat streaming when the shutdown comes still ends with its `done` frame.
        client, ws = await _chat(s, "c2")
        async with ws:
            assert (await client.next_for("c2"))["type"] == "accepted"
            first = await client.next_for("c2", timeout=20)
            assert first["type"] == "token", first
            out = _celery(s, "control", "shutdown", "-d", node, "-t", "1")
            tokens, done = await client.until_end("c2", timeout=40)
        assert done["type"] == "done", (done, out)
        assert len(tokens) > 1 and done["usage"]["completion_tokens"] > 0, done
        worker = s.procs["chat0"]
        worker.popen.wait(40)
        assert worker.popen.returncode == 0, worker.tail()
        log = worker.output()
        assert "warm shutdown: no new chats" in log and "still running" not in log, log[-3000:]


@pytest.mark.parametrize("switch", ["flag", "control"])
async def test_with_events_on_its_chats_reach_an_event_receiver(
    services: Services, migrated: str, tmp_path: Path, switch: str
) -> None:
    """`firsttoken worker --events`, or (what Flower does) `control enable_events` sent to a
    worker whose dispatcher is on for its heartbeats."""
    with make_stack(services, migrated, tmp_path, workers=0) as s:
        name = f"chat0-{s.prefix}@%h"
        if switch == "flag":
            s.start("chat0", ["-m", "firsttoken", "worker", "--events", "--name", name])
        else:
            s.start("chat0", celery_chat_worker(name, "--without-mingle"))
        s.wait_ready()
        s.wait_worker("chat0")
        if switch == "control":
            # Announced to the gateways once warm, the worker starts Celery's consumer (and
            # answers control commands) a moment later.
            assert _inspect(s, _node("chat0", s), "ping") == {"ok": "pong"}
            out = _celery(s, "control", "enable_events", "-d", _node("chat0", s), "-t", "10")
            assert "task events enabled" in out, out
        receiver = await asyncio.create_subprocess_exec(
            sys.executable, "-c", RECEIVER, "30", env=s.env(), stdout=asyncio.subprocess.PIPE
        )
        try:
            assert receiver.stdout is not None
            ready = await asyncio.wait_for(receiver.stdout.readline(), 30)
            assert ready == b"ready\n", ready
            await asyncio.sleep(1.0)  # it subscribes on its first read after that
            client, ws = await _chat(s, "e1")
            async with ws:
                job_id = (await client.next_for("e1"))["job_id"]
                _, done = await client.until_end("e1", timeout=30)
            assert done["type"] == "done", done
            stdout, _ = await asyncio.wait_for(receiver.communicate(), 30)
        finally:
            if receiver.returncode is None:
                receiver.kill()
                await receiver.wait()
        out = stdout.decode()
        seen = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        mine = [e["type"] for e in seen if e.get("uuid") == job_id]
        assert mine == ["task-received", "task-started", "task-succeeded"], seen
        received = next(e for e in seen if e["type"] == "task-received")
        assert received["name"] == "firsttoken.chat" and received["hostname"].startswith("chat0-")


# Prints every task event, one JSON object a line, until the first task succeeded or for at most
# argv[1] seconds.
RECEIVER = """
import json, sys, threading
from workers.app import app
seconds = float(sys.argv[1])
def show(event):
    if event["type"].startswith("task-"):
        print(json.dumps(event, default=str), flush=True)
    if event["type"] == "task-succeeded":
        recv.should_stop = True
with app.connection() as conn:
    recv = app.events.Receiver(conn, handlers={"*": show})
    recv.on_consume_ready = lambda *a, **k: print("ready", flush=True)
    timer = threading.Timer(seconds, lambda: setattr(recv, "should_stop", True))
    timer.daemon = True  # not holding the process once it stopped on its own
    timer.start()
    recv.capture(limit=None, timeout=None, wakeup=False)
"""


def test_a_second_signal_during_the_grace_period_cancels_the_running_chat(
    services: Services, tmp_path: Path
) -> None:
    """SIGTERM: warm shutdown (the chat goes on); SIGQUIT meanwhile: the chat is cancelled (its
    error frame published) and the worker exits at once, not after the grace period."""
    prefix = f"ftcold{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    env = child_env(
        redis_url=services.redis_url,
        redis_prefix=prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path}/cold.db",
        engine="sim",
        sim_itl_ms="200",
        sim_max_tokens="100",
        cache_enabled="false",
    )
    worker = Child(
        python_cmd("-m", "firsttoken", "worker", "--name", f"cold-{prefix}@%h"),
        env,
        tmp_path / "worker.log",
    )
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 60
        while not r.zrange(keys.worker_heartbeats("chat"), 0, -1):
            assert worker.alive() and time.monotonic() < deadline, worker.tail()
            time.sleep(0.1)
        job_id = new_id()
        now = time.time()
        job = ChatJob(
            job_id=job_id,
            chat_id="cold",
            tenant_id="t",
            key_id="k",
            messages=[{"role": "user", "content": "a long answer"}],  # type: ignore[list-item]
            max_tokens=100,
            received_at=now,
            enqueued_at=now,
            deadline_at=now + 60,
        )
        pubsub = r.pubsub()
        pubsub.subscribe(keys.job_channel(job_id))
        r.lpush(
            keys.queue_list("chat"),
            task_message(CHAT_TASK, {"job": job.model_dump()}, queue="chat", task_id=job_id),
        )
        kinds: list[str] = []
        while "T" not in kinds:
            m = pubsub.get_message(timeout=10)
            assert m is not None, worker.tail()
            if m["type"] == "message":
                kinds.append(m["data"][:1])
        os.killpg(worker.pid, signal.SIGTERM)
        time.sleep(1.0)
        assert worker.alive(), worker.tail()  # warm: the chat goes on
        t0 = time.monotonic()
        os.killpg(worker.pid, signal.SIGQUIT)
        worker.popen.wait(15)
        assert time.monotonic() - t0 < 10, worker.tail()
        while (m := pubsub.get_message(timeout=1)) is not None:
            if m["type"] == "message":
                kinds.append(m["data"][:1])
        pubsub.close()
        assert kinds[-1] == "E" and "D" not in kinds, kinds
        assert "cold shutdown: cancelling 1 running chats" in worker.output(), worker.tail()
    finally:
        worker.stop()
        found = list(r.scan_iter(f"{prefix}:*"))
        if found:
            r.delete(*found)
        r.close()


def test_a_chat_task_kombu_delivers_runs_the_same_way(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """The Celery `chat` task stays registered: a worker that receives it through kombu (here
    a bulk worker, the message sent to its queue by mistake) runs it on its loop, to `done`."""
    with make_stack(services, migrated, tmp_path, workers=0, gateway=False) as s:
        s.wait_worker("bulk", "bulk")
        keys = Keys(s.prefix)
        job_id = new_id()
        now = time.time()
        job = ChatJob(
            job_id=job_id,
            chat_id="kombu",
            tenant_id="t",
            key_id="k",
            messages=[{"role": "user", "content": "through kombu"}],  # type: ignore[list-item]
            max_tokens=8,
            received_at=now,
            enqueued_at=now,
            deadline_at=now + 30,
        )
        with s.redis() as r:
            pubsub = r.pubsub()
            pubsub.subscribe(keys.job_channel(job_id))
            r.lpush(
                keys.queue_list(BULK_QUEUE),
                task_message(
                    CHAT_TASK, {"job": job.model_dump()}, queue=BULK_QUEUE, task_id=job_id
                ),
            )
            kinds: list[str] = []
            deadline = time.monotonic() + 30
            while not {"D", "E"} & set(kinds) and time.monotonic() < deadline:
                m = pubsub.get_message(timeout=0.5)
                if m and m["type"] == "message":
                    kinds.append(m["data"][:1])
            pubsub.close()
        assert kinds[0] == "S" and "T" in kinds and kinds[-1] == "D", kinds


def test_kombu_reads_no_queue_of_the_loop_but_lists_it(services: Services) -> None:
    """workers/app.py's TaskConsumer on a real Redis: `chat` stays in its queue list (what
    `inspect active_queues` shows) but kombu never starts reading it; other queues are read
    as usual. Fails loudly if a kombu upgrade stops starting its reads in _basic_consume."""
    assert hasattr(Consumer, "_basic_consume"), "kombu changed: see workers/app.py TaskConsumer"
    with Connection(services.redis_url) as conn:
        channel = conn.default_channel
        queues = [Queue(name, routing_key=name, no_declare=True) for name in ("chat", "bulk")]
        consumer = TaskConsumer(channel, queues=queues, auto_declare=False)
        consumer.consume()
        try:
            assert [q.name for q in consumer.queues] == ["chat", "bulk"]
            assert consumer.consuming_from("bulk") and not consumer.consuming_from("chat")
            assert set(channel.active_queues) == {"bulk"}
            assert READ_ON_THE_LOOP == {"chat"}
        finally:
            consumer.cancel()


@pytest.fixture(autouse=True)
def _needs_celery_cli() -> None:
    pytest.importorskip("celery.bin.celery")
