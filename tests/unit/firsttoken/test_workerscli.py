"""`firsttoken workers` formatting over plain values (firsttoken/workerscli.py)."""

from __future__ import annotations

import json

from firsttoken.workerscli import Snapshot, as_json, as_table, by_queue, summary
from workers.workerstatus import WorkerStatus

NOW = 1000.0


def worker(name: str, queues: tuple[str, ...], age: float, **fields: object) -> WorkerStatus:
    values: dict[str, object] = {
        "name": name,
        "queues": queues,
        "host": "box",
        "pid": 7,
        "started_at": 0.0,
        "beat_at": NOW - age,
        **fields,
    }
    return WorkerStatus.model_validate(values)


SNAPSHOT = Snapshot(
    NOW,
    2.0,
    (
        worker("bulk@box", ("bulk", "summarize"), 0.5, capacity=8, done=30),
        worker("chat-b@box", ("chat",), 9.0, in_flight=5, capacity=256, done=4, engine_errors=2),
        worker("chat-a@box", ("chat",), 0.2, in_flight=3, capacity=256, done=11),
    ),
)


def test_workers_are_listed_under_each_queue_they_serve_in_the_stacks_order() -> None:
    pairs = [(queue, w.name) for queue, w in by_queue(SNAPSHOT)]
    assert pairs == [
        ("chat", "chat-a@box"),
        ("chat", "chat-b@box"),
        ("bulk", "bulk@box"),
        ("summarize", "bulk@box"),
    ]


def test_a_queues_load_adds_up_its_live_workers_only() -> None:
    queues = summary(SNAPSHOT)
    assert queues["chat"] == {"workers": 2, "alive": 1, "in_flight": 3, "capacity": 256}
    assert queues["bulk"] == {"workers": 1, "alive": 1, "in_flight": 0, "capacity": 8}


def test_json_gives_each_worker_its_heartbeat_age_and_staleness() -> None:
    report = json.loads(as_json(SNAPSHOT))
    assert report["lost_after_s"] == 2.0
    workers = {w["name"]: w for w in report["workers"]}
    assert workers["chat-b@box"]["stale"] is True
    assert workers["chat-b@box"]["heartbeat_age_s"] == 9.0
    assert workers["chat-b@box"]["engine_errors"] == 2
    assert workers["chat-a@box"]["stale"] is False
    assert workers["bulk@box"]["queues"] == ["bulk", "summarize"]
    assert "v" not in workers["bulk@box"]


def test_the_table_marks_the_stale_worker_and_sums_each_queue() -> None:
    table = as_table(SNAPSHOT)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "WORKER", "HOST"]
    (stale,) = [line for line in lines if "chat-b@box" in line]
    assert "9.0s ago STALE" in stale
    (live,) = [line for line in lines if "chat-a@box" in line]
    assert "STALE" not in live and "0.2s ago" in live
    assert "chat: 1 alive, 1 stale; 3/256 in flight" in lines
    assert "summarize: 1 alive; 0/8 in flight" in lines


def test_no_worker_at_all_says_so_and_hints_at_the_prefix() -> None:
    table = as_table(Snapshot(NOW, 2.0, ()))
    assert "no worker has sent a heartbeat" in table and "chat: 0 alive" in table


def test_redis_out_of_reach_exits_1_saying_which_setting_to_check() -> None:
    import os
    import subprocess
    import sys

    from tests.support import ROOT, free_port

    env = {**os.environ, "FIRSTTOKEN_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "workers"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Redis cannot be reached" in proc.stderr and "FIRSTTOKEN_REDIS_URL" in proc.stderr
