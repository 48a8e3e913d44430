"""The probes under bench/ run from the repository root as docs/benchmarks.md shows them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBES = ("burst_cpu.py", "wave.py", "hop.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("probe", PROBES)
def test_probe_imports_and_explains_itself(probe: str) -> None:
    proc = _run(f"bench/{probe}", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_hop_times_round_trips() -> None:
    proc = _run("bench/hop.py", "--rounds", "20", "--idle-ms", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    assert "back to back: round trip p50" in lines[0]
    assert "after 1 ms idle" in lines[1] and "woke late by" in lines[1]


def test_hop_refuses_a_pause_that_is_not_positive() -> None:
    proc = _run("bench/hop.py", "--idle-ms", "0")
    assert proc.returncode == 2
    assert "every pause must be more than 0 ms" in proc.stderr


def test_burst_window_must_end_before_the_first_token() -> None:
    # Checked before any process starts: a window past the simulator's first token would
    # count the answers' CPU as the burst's.
    proc = _run("bench/burst_cpu.py", "--window-ms", "150")
    assert proc.returncode == 2
    assert "--window-ms must be at least 0 and below" in proc.stderr
