"""The pipe's `max_pending` counts the calls queued for Redis, merged runs one by one."""

from __future__ import annotations

import pytest

from shared.redis import scripts
from shared.redis.pipe import RedisPipe


def test_merged_runs_count_one_by_one_against_max_pending() -> None:
    """Redis unreachable (never connected here): calls wait in memory up to `max_pending`,
    however many of them share one merged EVALSHA."""
    pipe = RedisPipe("redis://127.0.0.1:1/0", max_pending=3)
    chunk = pipe.script(scripts.CHUNK_SEND).keyed(("ch", "replay"))
    chunk.merge((b"T0\nx", b"100", b"60"))
    chunk.merge((b"T1\ny", b"100", b"0"))
    pipe.send((b"PING",))
    with pytest.raises(ConnectionError, match="3 commands wait"):
        chunk.merge((b"T2\nz", b"100", b"0"))
