"""Issue 30: the chat pool shows up in Flower. A real chat worker (`firsttoken worker --events`)
and a real Flower process (`celery -A workers.app flower`) on the stack's broker prefix: Flower's
HTTP API lists the worker, online and with `chat` among its active queues, and a chat sent
through the gateway appears among Flower's tasks as a `firsttoken.chat` task that succeeded on
that worker."""

from __future__ import annotations

import base64
import importlib.util
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import websockets

from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.support import free_port, port_open

# Flower's API answers only with authentication configured (or FLOWER_UNAUTHENTICATED_API):
# basic auth, as a deployment would run it.
USER = "firsttoken"


@dataclass
class Flower:
    stack: Stack
    port: int
    password: str
    node: str  # the chat worker's Celery node name

    def get(self, path: str) -> Any:
        """GET Flower's API at `path`; its JSON."""
        token = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Basic {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def poll(self, path: str, ok: Callable[[Any], bool], timeout: float, what: str) -> Any:
        """GET `path` until `ok(answer)`; the last answer (the test asserts on it)."""
        deadline = time.monotonic() + timeout
        answer: Any = None
        while time.monotonic() < deadline:
            try:
                answer = self.get(path)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                answer = exc
            else:
                if ok(answer):
                    return answer
            time.sleep(0.5)
        flower_log = self.stack.procs["flower"].tail()
        raise AssertionError(f"{what}: last answer {answer!r}\n--- flower log ---\n{flower_log}")


def _start_flower(stack: Stack, password: str) -> int:
    """Flower on a free port with the stack's env (workers.app's broker, the stack's prefix).
    Skips the test, with Flower's own output, if Flower is missing or cannot start."""
    if importlib.util.find_spec("flower") is None:
        pytest.skip("flower is not installed (it is in the `test` extra)")
    port = free_port()
    flower = stack.start(
        "flower",
        [
            "-m",
            "celery",
            "-A",
            "workers.app",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            f"--basic-auth={USER}:{password}",
        ],
    )
    deadline = time.monotonic() + 30
    while not port_open(port):
        if not flower.alive() or time.monotonic() > deadline:
            reason = "exited" if not flower.alive() else "did not listen within 30 s"
            pytest.skip(f"Flower could not start ({reason}): {flower.tail(1500)}")
        time.sleep(0.1)
    return port


@pytest.fixture(scope="module")
def flower(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Flower]:
    """A stack (sim, gateway, bulk worker) with one chat worker started with task events on,
    and Flower on its broker."""
    logs = tmp_path_factory.mktemp("flower")
    with make_stack(services, migrated, logs, workers=0) as s:
        name = f"chat0-{s.prefix}@%h"
        s.start(
            "chat0", ["-m", "firsttoken", "worker", "--queues", "chat", "--events", "--name", name]
        )
        s.wait_ready()
        s.wait_worker("chat0")
        password = uuid.uuid4().hex
        port = _start_flower(s, password)
        yield Flower(s, port, password, f"chat0-{s.prefix}@{socket.gethostname()}")


def test_flower_lists_the_chat_worker_online_with_the_chat_queue(flower: Flower) -> None:
    """Flower's /api/workers?refresh=1 lists the chat worker with `chat` among its active
    queues and its stats, and its heartbeats make it online in Flower."""
    node = flower.node
    workers = flower.poll(
        "/api/workers?refresh=1",
        lambda w: bool(w.get(node, {}).get("active_queues")) and "stats" in w.get(node, {}),
        60,
        f"{node} with its active queues in Flower",
    )
    queues = [q["name"] for q in workers[node]["active_queues"]]
    assert "chat" in queues, workers[node]["active_queues"]
    assert queues == ["chat"], queues  # a chat-only pool
    # Only this stack's workers: the prefix keeps other runs' workers out of this broker.
    assert all(n.endswith(f"-{flower.stack.prefix}@{socket.gethostname()}") for n in workers)
    stats = workers[node]["stats"]
    assert stats["chat"]["slots"] > 0 and "solo" in stats["pool"]["implementation"], stats
    status = flower.poll(
        "/api/workers?status=1", lambda s: s.get(node) is True, 30, f"{node} online"
    )
    assert status[node] is True, status


async def test_a_chat_through_the_gateway_shows_in_flower_as_a_succeeded_task(
    flower: Flower,
) -> None:
    """A chat sent over the websocket appears in Flower's /api/tasks and /api/task/info as a
    `firsttoken.chat` task that succeeded on the chat worker."""
    s = flower.stack
    ws = await websockets.connect(
        s.ws_url, additional_headers={"Authorization": f"Bearer {s.api_key}"}
    )
    async with ws:
        client = Client(ws)
        await client.chat("f1", "a question for Flower to see")
        accepted = await client.next_for("f1", timeout=20)
        assert accepted["type"] == "accepted", accepted
        job_id = accepted["job_id"]
        tokens, done = await client.until_end("f1", timeout=30)
    assert done["type"] == "done" and tokens, done

    # Flower's event receiver gets the worker's events within a second or so of the chat.
    tasks = flower.poll(
        "/api/tasks?limit=100",
        lambda t: t.get(job_id, {}).get("state") == "SUCCESS",
        30,
        f"task {job_id} SUCCESS in Flower",
    )
    task = tasks[job_id]
    assert task["name"] == "firsttoken.chat", task
    assert task["worker"] == flower.node, task
    info = flower.get(f"/api/task/info/{job_id}")
    assert info["uuid"] == job_id and info["state"] == "SUCCESS", info
    assert info["name"] == "firsttoken.chat" and info["worker"] == flower.node, info
    assert info["received"] and info["started"] and info["succeeded"], info
    types = flower.get("/api/task/types")
    assert "firsttoken.chat" in types["task-types"], types
