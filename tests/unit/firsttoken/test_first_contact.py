"""Issue 42, the pure parts: a worker's default name, the file `firsttoken up` leaves for the
commands run beside it, and the one line the CLI prints for an error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from firsttoken import stackfile
from firsttoken.clierrors import explain
from firsttoken.workername import LiveWorker, default_name, pid_running, refusal
from shared.errors import ConfigError


def test_default_names_carry_the_pid_or_the_procfile_process() -> None:
    assert default_name(["chat"], {}, 42) == "chat-42@%h"
    assert default_name(["chat", "bulk"], {}, 7) == "chat-bulk-7@%h"
    assert default_name(["chat"], {"PS": "worker_chat.1"}, 42) == "worker_chat.1-42@%h"
    assert default_name(["bulk"], {"DYNO": "web 2"}, 3) == "web-2-3@%h"


def addresses(pid: int) -> stackfile.StackAddresses:
    return stackfile.StackAddresses(
        pid=pid,
        redis_url="redis://127.0.0.1:41000/0",
        redis_prefix="ft",
        database_url="sqlite+aiosqlite:///.firsttoken/firsttoken.db",
        gateway_url="http://127.0.0.1:8000",
        ws_url="ws://127.0.0.1:8000/v1/ws",
        page_url="http://127.0.0.1:8000/",
    )


def test_the_running_ups_addresses_fill_what_the_environment_leaves_unset(tmp_path: Path) -> None:
    path = tmp_path / "up.json"
    stackfile.write(addresses(os.getpid()), path)
    env: dict[str, str] = {}
    line = stackfile.apply(env, path)
    assert env["FIRSTTOKEN_REDIS_URL"] == "redis://127.0.0.1:41000/0"
    assert env["FIRSTTOKEN_REDIS_PREFIX"] == "ft"
    assert "redis://127.0.0.1:41000/0" in line and "firsttoken up" in line
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_an_explicit_redis_wins_over_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "up.json"
    stackfile.write(addresses(os.getpid()), path)
    env = {"FIRSTTOKEN_REDIS_URL": "redis://:pw@other:6379/1"}
    line = stackfile.apply(env, path)
    assert env == {"FIRSTTOKEN_REDIS_URL": "redis://:pw@other:6379/1"}
    assert "from FIRSTTOKEN_REDIS_URL" in line and "pw" not in line


def test_a_file_left_by_a_dead_up_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "up.json"
    stackfile.write(addresses(2**22 + 12345), path)  # above Linux's pid_max default
    env: dict[str, str] = {}
    assert "the default" in stackfile.apply(env, path) and env == {}


def test_errors_become_one_line_that_says_what_to_do() -> None:
    env = {"FIRSTTOKEN_REDIS_URL": "redis://127.0.0.1:1/0"}
    bad = explain(ConfigError("invalid configuration:\n  FIRSTTOKEN_X: bad"), env)
    assert "\n" not in bad and "FIRSTTOKEN_X" in bad
    refused = explain(redis.ConnectionError("Connection refused"), env)
    assert "Redis cannot be reached at redis://127.0.0.1:1/0" in refused
    missing = explain(ModuleNotFoundError("No module named 'openai'", name="openai"), env)
    assert "pip install" in missing and "openai" in missing
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except OSError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as exc:
        assert "cannot connect" in explain(exc, env)
    assert "--debug" in explain(ZeroDivisionError("x"), env)


def test_the_refusal_names_the_live_worker() -> None:
    text = refusal(LiveWorker("chat@h", 0.4, "h", 99))
    assert "chat@h" in text and "pid 99" in text and "--name" in text and "\n" not in text


@pytest.mark.parametrize(
    ("worker", "running", "dead"),
    [
        (LiveWorker("chat@h", 0.4, "h", 99), False, True),  # crashed here: its pid runs nothing
        (LiveWorker("chat@h", 0.4, "h", 99), True, False),  # alive here: refused
        (LiveWorker("chat@h", 0.4, "h", 7), True, True),  # this very pid (a restarted container)
        (LiveWorker("chat@h", 0.4, "other", 99), False, False),  # another host's: cannot tell
        (LiveWorker("chat@h", 0.4, "h", None), False, False),  # no status record
    ],
)
def test_only_this_hosts_dead_predecessor_is_waited_for(
    worker: LiveWorker, running: bool, dead: bool
) -> None:
    assert worker.is_dead_predecessor("h", 7, lambda pid: running) is dead


def test_pid_running_sees_this_process_and_not_a_reaped_or_zombie_child() -> None:
    assert pid_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pid_running(child.pid):
        time.sleep(0.02)  # exited and not reaped: a zombie, not running
    assert not pid_running(child.pid)
    child.wait()
    assert not pid_running(child.pid)
