"""The bench's readings of the machine: busy share from /proc/stat, a process's CPU, the local
Redis's pid."""

from __future__ import annotations

import math
import os
import sys
import time

import pytest

from firsttoken.bench.stack import (
    DEFAULT_REDIS_URL,
    busy_share,
    cpu_seconds,
    machine_ticks,
    redis_pid,
)
from tests.support import redis_available

pytestmark = pytest.mark.integration


def test_busy_share_between_two_samples() -> None:
    assert busy_share((100, 40), (300, 90)) == pytest.approx(0.75)  # 50 idle of 200 ticks
    assert math.isnan(busy_share((100, 40), (100, 40)))  # no time passed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_machine_ticks_grow_and_idle_is_part_of_all() -> None:
    before = machine_ticks()
    sum(i * i for i in range(200_000))
    after = machine_ticks()
    assert after[0] >= before[0] > before[1] >= 0


@pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
    reason="needs the kernel's scheduler statistics (/proc/PID/task/*/schedstat)",
)
def test_a_process_cpu_is_counted_below_one_clock_tick() -> None:
    # A short run's few ms of CPU in a process: clock ticks (10 ms) mostly counted none.
    before = cpu_seconds(os.getpid())
    start = time.thread_time()
    while time.thread_time() - start < 0.002:
        pass
    spent = cpu_seconds(os.getpid()) - before
    assert 0.002 <= spent < 0.5


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_redis_pid_is_the_local_servers_and_none_when_unreachable() -> None:
    pid = redis_pid(DEFAULT_REDIS_URL)
    assert pid is not None
    with open(f"/proc/{pid}/comm") as comm:
        assert comm.read().startswith("redis")
    assert redis_pid("redis://127.0.0.1:1/0") is None
