"""Stopping a bench's children: an interrupt during the stop kills the rest, never strands them."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from firsttoken.procs import Child, stop_all

pytestmark = pytest.mark.integration

# Ignores SIGTERM, as a child busy with a long graceful shutdown would.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    started = [
        Child([sys.executable, "-c", STUBBORN], {}, tmp_path / f"child{i}.log") for i in range(2)
    ]
    time.sleep(0.5)  # both have set their SIGTERM handler
    yield started
    for child in started:
        if child.alive():
            child.kill()


def _interrupt_after(seconds: float) -> None:
    def raise_interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, raise_interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def test_an_interrupt_while_stopping_kills_the_rest_then_is_raised(
    children: list[Child],
) -> None:
    previous = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    try:
        _interrupt_after(0.5)  # the first child is still ignoring its SIGTERM
        with pytest.raises(KeyboardInterrupt):
            stop_all(children)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not any(child.alive() for child in children)
    assert time.monotonic() - t0 < 5  # not the 10 s graceful wait per child


def test_stop_all_without_an_interrupt_stops_every_child(tmp_path: Path) -> None:
    polite = [
        Child([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / f"p{i}.log")
        for i in range(3)
    ]
    stop_all(polite)
    assert not any(child.alive() for child in polite)
