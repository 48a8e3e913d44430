"""Issue 42: two chat workers started the Procfile's way on one host (`firsttoken worker
--queues chat`, no `--name`) get distinct names, so when one is SIGKILLed its chats continue on
the other; a worker started under the name of a live one refuses to start, in one line."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from firsttoken.procs import Child
from shared.keys import CHAT_QUEUE, Keys
from tests.faults.test_worker_death import (
    LONG,
    SETTINGS,
    all_ends,
    answer,
    connect,
    seqs_contiguous,
    start_chats,
    usage_rows,
)
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import python_cmd, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
async def opened() -> AsyncIterator[list[Any]]:
    """Websockets a test opened (with `connect`), closed after it."""
    sockets: list[Any] = []
    yield sockets
    for ws in sockets:
        await ws.close()


def default_worker(stack: Stack, label: str) -> Child:
    """`firsttoken worker --queues chat` exactly as the Procfile runs it: no --name."""
    return stack.start(label, ["-m", "firsttoken", "worker", "--queues", "chat"])


def chat_beats(stack: Stack) -> list[str]:
    with stack.redis() as client:
        return list(client.zrange(Keys(stack.prefix).worker_heartbeats(CHAT_QUEUE), 0, -1))


def leases(stack: Stack, node: str) -> set[str]:
    with stack.redis() as client:
        return set(client.hkeys(Keys(stack.prefix).worker_jobs(node)))


async def test_two_default_named_chat_workers_get_distinct_names_and_take_over(
    services: Services,
    migrated: str,
    logs: Path,
    opened: list[Any],
) -> None:
    """Both heartbeat under names of their own (queue, pid, host); SIGKILL the busier one under
    twenty streaming chats and every chat ends `done` on the other, seqs contiguous, the
    continued ones exactly among the dead worker's."""
    with make_stack(services, migrated, logs, workers=0, sim_args=LONG, **SETTINGS) as stack:
        a, b = default_worker(stack, "a"), default_worker(stack, "b")
        host = socket.gethostname()
        nodes = {"a": f"chat-{a.pid}@{host}", "b": f"chat-{b.pid}@{host}"}
        wait_until(
            lambda: set(nodes.values()) <= set(chat_beats(stack)), 60, what="both heartbeats"
        )
        assert nodes["a"] != nodes["b"]
        stack.wait_ready()
        client = await connect(stack, opened)
        jobs = await start_chats(client, 20)
        firsts = {c: await client.next_for(c) for c in jobs}
        assert all(f["type"] == "token" for f in firsts.values()), firsts
        await asyncio.sleep(0.5)
        held = {w: leases(stack, node) for w, node in nodes.items()}
        victim = max(held, key=lambda w: len(held[w]))
        assert held[victim], held
        stack.procs[victim].kill()
        for c, f in firsts.items():
            client.frames.setdefault(c, []).insert(0, f)
        ended = await all_ends(client, list(jobs))
        ends = {c: (tokens, end) for c, (tokens, end, _) in ended.items()}
        assert all(end["type"] == "done" for _, end in ends.values()), [
            end for _, end in ends.values() if end["type"] != "done"
        ]
        assert all(seqs_contiguous(tokens) for tokens, _ in ends.values())
        assert len({answer(tokens) for tokens, _ in ends.values()}) == 1
        continued = {jobs[c] for c, (_, end) in ends.items() if end.get("continued")}
        assert continued and continued <= held[victim], (continued, held)
        rows = await usage_rows(stack, list(jobs.values()))
        assert len(rows) == 20 and all(r[0] == "ok" for r in rows.values()), rows


def test_a_worker_named_like_a_live_one_refuses_to_start(
    services: Services,
    migrated: str,
    logs: Path,
) -> None:
    """The second `--name twin@%h` exits 1 at once with one line naming the live worker (its
    pid) and what to do; the first keeps running."""
    with make_stack(services, migrated, logs, workers=0, bulk=False, gateway=False) as stack:
        name = f"twin-{stack.prefix}@%h"
        first = stack.start("first", ["-m", "firsttoken", "worker", "--name", name])
        node = name.replace("%h", socket.gethostname())
        wait_until(lambda: node in chat_beats(stack), 60, what="the first worker's heartbeat")
        started = time.monotonic()
        second = subprocess.run(
            python_cmd("-m", "firsttoken", "worker", "--name", name),
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        assert time.monotonic() - started < 30
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert lines == [lines[-1]] and "Traceback" not in second.stderr, second.stderr
        assert node in lines[0] and f"pid {first.pid}" in lines[0] and "--name" in lines[0]
        assert first.alive()
