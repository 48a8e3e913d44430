"""The bench's readings of the machine: busy share from /proc/stat, the local Redis's pid."""

from __future__ import annotations

import math
import sys

import pytest

from firsttoken.bench.stack import DEFAULT_REDIS_URL, busy_share, machine_ticks, redis_pid
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


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_redis_pid_is_the_local_servers_and_none_when_unreachable() -> None:
    pid = redis_pid(DEFAULT_REDIS_URL)
    assert pid is not None
    with open(f"/proc/{pid}/comm") as comm:
        assert comm.read().startswith("redis")
    assert redis_pid("redis://127.0.0.1:1/0") is None
