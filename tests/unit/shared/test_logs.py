"""shared/logs.py's OutageLog: one line when an outage starts, a reminder every 30 s while it
lasts, one line when it ends, nothing for a lone failed try; an injected clock, no sleeping."""

from __future__ import annotations

import logging
import re

import pytest

from shared.logs import OutageLog

LOGGER = logging.getLogger("test.outage")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    return caplog


def texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_an_outage_is_one_line_a_reminder_every_30s_and_one_line_at_its_end(
    clock: Clock, said: pytest.LogCaptureFixture
) -> None:
    outage = OutageLog(LOGGER, "heartbeat", clock=clock)
    for _ in range(600):  # a try every 0.1 s for 60 s
        outage.failed(ConnectionError("Connection refused"))
        clock.now += 0.1
    lines = texts(said)
    assert len(lines) == 2, lines  # the start, and one reminder at 30 s (the next is due at 60)
    assert lines[0] == (
        "heartbeat: Redis unreachable (ConnectionError: Connection refused); "
        "retrying quietly, a reminder every 30s"
    )
    assert re.search(r"still unreachable after 30s \(30[23] failed tries; last: Conn", lines[1])
    assert outage.down
    outage.ok()
    outage.ok()
    lines = texts(said)
    assert len(lines) == 3
    assert lines[2] == "heartbeat: Redis reachable again after 60.0s (600 failed tries)"
    assert not outage.down
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said.records)


def test_a_second_outage_starts_afresh(clock: Clock, said: pytest.LogCaptureFixture) -> None:
    outage = OutageLog(LOGGER, "relay", remind_s=5, clock=clock)
    for _ in range(2):
        outage.failed(TimeoutError())
        clock.now += 0.5
    outage.ok()
    clock.now += 100
    for _ in range(2):
        outage.failed(OSError("Network is unreachable\n  (multi-line)"))
    lines = texts(said)
    assert (
        lines[0] == "relay: Redis unreachable (TimeoutError); retrying quietly, a reminder every 5s"
    )
    assert lines[1] == "relay: Redis reachable again after 1.0s (2 failed tries)"
    assert lines[2].startswith("relay: Redis unreachable (OSError: Network is unreachable (multi")
    assert len(lines) == 3


def test_a_lone_failed_try_is_no_outage(clock: Clock, said: pytest.LogCaptureFixture) -> None:
    """A pooled connection that died with the old server fails once after Redis is back."""
    outage = OutageLog(LOGGER, "failover check", clock=clock)
    for _ in range(5):
        outage.failed(ConnectionError("Connection closed by server."))
        clock.now += 0.5
        outage.ok()
        assert not outage.down
    assert texts(said) == []
