"""The first-wave probes under bench/ against a real stack (the bench's own, on the machine's
Redis and PostgreSQL, else the embedded defaults), at the smallest size that exercises them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def test_burst_cpu_counts_every_process_in_the_window() -> None:
    proc = _run(
        "bench/burst_cpu.py",
        "--streams",
        "3",
        "--bursts",
        "2",
        "--repeats",
        "1",
        "--window-ms",
        "100",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "CPU per chat in the first 100 ms of bursts of 3" in out
    for name in ("gateway", "worker-chat0", "redis", "sim", "client"):
        assert f"  {name} " in out, out
    assert "ms of CPU per burst, at least" in out


def test_wave_places_every_chat_on_one_time_line() -> None:
    proc = _run("bench/wave.py", "--streams", "3", "--bursts", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "burst 1: chats past each point" in out
    slowest = next(line for line in out.splitlines() if "slowest, mean ms" in line)
    for point in ("sent", "received", "picked_up", "engine_request", "first_token"):
        assert f"{point} " in slowest, slowest


def test_cold_path_times_each_step_hot_and_after_each_pause() -> None:
    proc = _run("bench/cold_path.py", "--calls", "3", "--pauses", "0,2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "after sleeping: 0 ms, 2 ms" in lines[0], lines
    rows = {line[:22].strip(): line[22:].split() for line in lines[1:]}
    assert set(rows) == {"websocket frame", "HTTP door body", "task message + job"}, rows
    assert all(len(cells) == 2 and all(float(c) > 0 for c in cells) for cells in rows.values())
