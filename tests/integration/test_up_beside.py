"""Issue 42, first contact, the operator's side: the commands run beside `firsttoken up` find
its Redis (a random port) through `.firsttoken/up.json` and say which Redis they read; the
banner shows the chat page; `chat -` reads the question from stdin; Ctrl-C stops everything
within 2 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT, free_port

pytestmark = pytest.mark.integration


def clean_env() -> dict[str, str]:
    """A fresh shell's environment: no FIRSTTOKEN_ variable, so `up` runs its embedded Redis
    on a free port and the commands have only the file to find it by."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    return env


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    dir: Path
    log: Path
    port: int

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def addresses(self) -> dict[str, object]:
        return dict(json.loads((self.dir / ".firsttoken" / "up.json").read_text()))

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`firsttoken ARGS` in up's directory, as a user in another terminal runs it."""
        return subprocess.run(
            [sys.executable, "-m", "firsttoken", *args],
            cwd=self.dir,
            env=clean_env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def sigint(self) -> float:
        """Ctrl-C to `up` alone (its children lead sessions of their own, as from a
        terminal); returns the seconds until it exited."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        return time.monotonic() - started


def start_up(tmp_path: Path) -> Up:
    port = free_port()
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "firsttoken", "up", "--port", str(port)],
            cwd=tmp_path,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    up = Up(proc, tmp_path, log, port)
    deadline = time.monotonic() + 90
    while "try:  firsttoken chat" not in up.text():
        assert proc.poll() is None, up.text()
        assert time.monotonic() < deadline, up.text()
        time.sleep(0.2)
    return up


def children_of(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    running = start_up(tmp_path_factory.mktemp("up"))
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            os.killpg(running.proc.pid, signal.SIGTERM)
            running.proc.wait(30)


def test_the_banner_shows_the_chat_page_and_the_redis_it_started(up: Up) -> None:
    """The banner names the page, the Redis and its prefix, the database; the same addresses
    are in .firsttoken/up.json, and the page is served where the banner says."""
    found = up.addresses()
    text = up.text()
    assert found["pid"] == up.proc.pid
    assert found["redis_url"] != "redis://127.0.0.1:6379/0"  # the embedded one, a free port
    assert f"Redis:       {found['redis_url']} (prefix ft)" in text, text
    assert f"chat page:   http://127.0.0.1:{up.port}/" in text, text
    assert found["page_url"] == f"http://127.0.0.1:{up.port}/"
    with urllib.request.urlopen(str(found["page_url"]), timeout=5) as resp:
        assert resp.status == 200 and b"<html" in resp.read().lower()
    # Running as root, Celery's SecurityWarning is no longer printed once per worker.
    assert "SecurityWarning" not in text, text


def test_workers_json_beside_up_lists_ups_workers(up: Up) -> None:
    """`firsttoken workers --json` in up's directory, with no FIRSTTOKEN_ variable, lists the
    three workers up started (their pids are up's children); stdout is pure JSON and stderr
    says which Redis was read."""
    url = str(up.addresses()["redis_url"])
    kids = children_of(up.proc.pid)
    deadline = time.monotonic() + 30
    while True:
        done = up.run("workers", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        queues = {q for w in report["workers"] for q in w["queues"]}
        if queues >= {"chat", "bulk", "summarize"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert queues >= {"chat", "bulk", "summarize"}, report
    assert {w["pid"] for w in report["workers"]} <= kids, (report, kids)
    assert all("-" in w["name"].split("@")[0] for w in report["workers"])  # QUEUE-PID@host
    assert f"reading Redis {url} prefix 'ft'" in done.stderr and "firsttoken up" in done.stderr


def test_celery_pass_through_beside_up_pings_ups_workers(up: Up) -> None:
    """`firsttoken celery inspect ping` reaches up's three Celery nodes on up's Redis."""
    done = up.run("celery", "inspect", "ping", "--timeout", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 nodes online" in done.stdout, done.stdout
    assert str(up.addresses()["redis_url"]) in done.stderr


def test_chat_dash_reads_the_question_from_stdin(up: Up) -> None:
    """A long question piped in is asked whole (the prompt counts its tokens)."""
    question = " ".join(f"word{i}" for i in range(400))
    done = up.run("chat", "-", "--no-cache", stdin=question + "\n")
    assert done.returncode == 0, done.stderr
    assert "finish=" in done.stdout
    prompt = int(done.stdout.split("prompt=")[1].split()[0])
    assert prompt >= 400, done.stdout
    empty = up.run("chat", "-", stdin="")
    assert empty.returncode == 2 and "stdin" in empty.stderr and "Traceback" not in empty.stderr


def test_sigint_stops_up_and_everything_it_started_without_the_grace_period(
    tmp_path: Path,
) -> None:
    """Ctrl-C: up exits 0 without waiting out its workers' grace period (the bound is a third of
    it, room for a loaded host), its children and its Redis are gone, the file too; a command
    run afterwards says no `up` is running rather than reading a dead one's Redis."""
    up = start_up(tmp_path)
    time.sleep(1.0)  # settled: every worker beating
    kids = children_of(up.proc.pid)
    assert len(kids) >= 5, kids  # gateway, three workers, Redis
    took = up.sigint()
    assert up.proc.returncode == 0, up.text()
    assert took < 10.0, f"stopped in {took:.2f}s\n{up.text()}"
    assert "firsttoken: stopped" in up.text()
    assert "Traceback" not in up.text(), up.text()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in kids), kids
    assert not (tmp_path / ".firsttoken" / "up.json").exists()
    after = up.run("workers")
    assert "no `firsttoken up` running here" in after.stderr, after.stderr
    print(f"\nSIGINT to exit: {took:.2f}s")


def test_usage_by_tenant_shows_names_and_json_keeps_the_ids(up: Up) -> None:
    """After a chat, `usage` names up's tenant `dev` (not its id); `--format json` has both."""
    assert up.run("chat", "usage row, please", "--no-cache").returncode == 0
    deadline = time.monotonic() + 30
    while True:
        done = up.run("usage", "--format", "json")
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # the usage row is written by the bulk worker, a moment later
    (row,) = rows
    assert row["tenant"] == "dev" and len(row["tenant_id"]) >= 16 and row["tenant_id"] != "dev"
    table = up.run("usage").stdout
    assert "\ndev " in table and row["tenant_id"] not in table, table
