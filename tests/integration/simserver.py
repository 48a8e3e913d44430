"""A simulator server process for the engine-level tests, and readers of its /metrics."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from firsttoken.procs import Child
from tests.support import child_env, free_port, port_open, python_cmd, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a sim server with 20 ms to first token and 5 ms between tokens."""
    port = free_port()
    log: Path = tmp_path_factory.mktemp("simserver") / "server.log"
    proc = Child(
        python_cmd(
            "-m", "firsttoken.simserver", "--port", str(port), "--ttft-ms", "20", "--itl-ms", "5"
        ),
        child_env(),
        log,
    )
    try:
        wait_until(lambda: port_open(port) or not proc.alive(), timeout=20, what="sim server")
        assert proc.alive(), proc.output()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


async def metrics(base: str) -> dict[str, float]:
    """The simulator's firsttoken_sim_* series, by name."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{base}/metrics")).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(firsttoken_sim_\w+) ([0-9.e+-]+)$", text, re.MULTILINE)
    }


async def wait_metrics(
    base: str, predicate: Callable[[dict[str, float]], bool], within: float
) -> dict[str, float]:
    """Poll /metrics until `predicate` holds or `within` seconds pass; the last reading."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        current = await metrics(base)
        if predicate(current) or asyncio.get_running_loop().time() > deadline:
            return current
        await asyncio.sleep(0.02)
