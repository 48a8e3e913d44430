"""Issue 32: `firsttoken workers` lists the real worker processes of a running stack from
their heartbeats (two chat workers and a bulk worker, as Celery processes): host, pid,
capacity, the chats each has done and its engine errors; a worker SIGKILLed shows as stale."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.support import ROOT, python_cmd, wait_until

pytestmark = pytest.mark.integration

CHAT_SLOTS = 7
BULK_THREADS = 3
CHATS = 6


def workers_command(stack: Stack, *args: str) -> str:
    """`firsttoken workers ARGS` run as an operator would, with the stack's settings."""
    proc = subprocess.run(
        python_cmd("-m", "firsttoken", "workers", *args),
        env=stack.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def workers_json(stack: Stack) -> dict[str, Any]:
    return dict(json.loads(workers_command(stack, "--json")))


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's workers by test name (chat0, bulk: the part before '-<prefix>@')."""
    return {w["name"].split("-", 1)[0]: w for w in report["workers"]}


def wait_report(stack: Stack, ok: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """Run the command until its report satisfies `ok` (heartbeats land once a second)."""
    last: list[dict[str, Any]] = []

    def check() -> bool:
        last[:] = [workers_json(stack)]
        return ok(last[0])

    try:
        wait_until(check, 30, interval=0.5, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{what}: last report {last}") from exc
    return last[0]


async def run_chats(stack: Stack, count: int) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
        client = Client(ws)
        for i in range(count):
            await client.chat(f"c{i}", f"question number {i}", cache=False)
        return [(await client.until_end(f"c{i}"))[1] for i in range(count)]


async def test_workers_lists_each_process_with_its_load_and_marks_a_killed_one_stale(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """Two chat workers and a bulk worker are listed with their host, pid, queue and
    capacity; the chats done add up to the chats run; after a SIGKILL the killed worker is
    stale and the others are not; an engine that went away counts as an engine error."""
    with make_stack(
        services,
        migrated,
        tmp_path,
        workers=2,
        chat_concurrency=str(CHAT_SLOTS),
        bulk_concurrency=str(BULK_THREADS),
    ) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        stack.wait_worker("chat1")
        stack.wait_worker("bulk", "bulk")
        ends = await run_chats(stack, CHATS)
        assert [e["type"] for e in ends] == ["done"] * CHATS, ends

        def all_counted(report: dict[str, Any]) -> bool:
            # Fresh beats of all three as well: on a loaded machine one beat may come late, and
            # a late one reads stale for that moment.
            workers = by_name(report)
            chats = [workers.get(n, {}) for n in ("chat0", "chat1")]
            fresh = all(
                workers.get(n, {}).get("stale") is False for n in ("chat0", "chat1", "bulk")
            )
            return fresh and sum(w.get("done", 0) for w in chats) == CHATS

        report = wait_report(stack, all_counted, "every chat counted in a heartbeat")
        workers = by_name(report)
        for name in ("chat0", "chat1", "bulk"):
            w = workers[name]
            assert w["host"] == socket.gethostname(), w
            assert w["pid"] == stack.procs[name].pid, w  # the worker is the process started
            assert w["stale"] is False and w["heartbeat_age_s"] < report["lost_after_s"], w
        assert workers["chat0"]["queues"] == ["chat"] and workers["bulk"]["queues"] == ["bulk"]
        assert workers["chat0"]["capacity"] == workers["chat1"]["capacity"] == CHAT_SLOTS
        assert workers["bulk"]["capacity"] == BULK_THREADS
        assert workers["chat0"]["engine_errors"] == workers["chat1"]["engine_errors"] == 0
        assert report["queues"]["chat"] == {
            "workers": 2,
            "alive": 2,
            "in_flight": 0,
            "capacity": 2 * CHAT_SLOTS,
        }

        stack.procs["chat1"].kill()  # SIGKILL: no goodbye, its record stays
        report = wait_report(
            stack,
            lambda r: (
                by_name(r).get("chat1", {}).get("stale") is True
                and by_name(r)["chat0"]["stale"] is False
                and by_name(r)["bulk"]["stale"] is False
            ),
            "the killed worker marked stale, the others not",
        )
        workers = by_name(report)
        assert workers["chat1"]["heartbeat_age_s"] > report["lost_after_s"]
        assert workers["chat0"]["stale"] is False and workers["bulk"]["stale"] is False
        assert report["queues"]["chat"]["alive"] == 1
        table = workers_command(stack)
        (killed_row,) = [line for line in table.splitlines() if "chat1-" in line]
        assert "STALE" in killed_row and str(stack.procs["chat1"].pid) in killed_row, table

        # The engine goes away: the next chat ends `engine_error` on the survivor, counted.
        stack.procs["sim"].kill()
        (end,) = await run_chats(stack, 1)
        assert end["type"] == "error" and end["code"] == "engine_error", end
        wait_report(
            stack,
            lambda r: by_name(r)["chat0"]["engine_errors"] == 1,
            "the engine error counted",
        )
