"""`firsttoken worker` as Celery arguments: a chat-only worker on the solo pool (its chats never
pass through the pool), other queues on threads, task events and worker heartbeats only with
--events; and the process arguments `firsttoken up` starts a worker with."""

from __future__ import annotations

import os

import pytest

from firsttoken.cli import build_parser, worker_argv
from firsttoken.procs import worker_args


def test_a_chat_worker_is_a_celery_worker_on_the_solo_pool() -> None:
    argv = worker_argv(["chat"], concurrency=8, name=None, loglevel="info", events=False)
    assert argv[:2] == ["--quiet", "worker"]
    assert argv[argv.index("-Q") + 1] == "chat"
    assert argv[argv.index("-P") + 1] == "solo" and argv[argv.index("-c") + 1] == "1"
    assert argv[argv.index("-n") + 1] == f"chat-{os.getpid()}@%h"  # unique by default
    assert "--without-heartbeat" in argv and "-E" not in argv


def test_bulk_runs_threads_and_events_switch_on_heartbeats() -> None:
    argv = worker_argv(["bulk"], concurrency=4, name="b@%h", loglevel="warning", events=True)
    assert argv[argv.index("-P") + 1] == "threads" and argv[argv.index("-c") + 1] == "4"
    assert argv[argv.index("-n") + 1] == "b@%h"
    assert "-E" in argv and "--without-heartbeat" not in argv


def test_a_worker_for_chat_and_bulk_runs_threads_for_bulk() -> None:
    argv = worker_argv(["chat", "bulk"], concurrency=4, name=None, loglevel="info", events=False)
    assert argv[argv.index("-Q") + 1] == "chat,bulk"
    assert argv[argv.index("-P") + 1] == "threads"
    assert argv[argv.index("-n") + 1] == f"chat-bulk-{os.getpid()}@%h"


def test_the_pool_choice_is_gone_and_every_option_has_help() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--pool", "celery"])
    worker = next(
        a.choices["worker"]
        for a in parser._subparsers._group_actions  # type: ignore[union-attr]
    )
    for action in worker._actions:
        assert action.help, action.dest


def test_worker_args() -> None:
    assert worker_args("chat") == ["-m", "firsttoken", "worker", "--queues", "chat"]
    assert worker_args("summarize", name="s@%h", concurrency=2)[-4:] == [
        "--name",
        "s@%h",
        "--concurrency",
        "2",
    ]
