"""`firsttoken metrics-server` serves a host's worker series where no gateway runs (issue 32):
a chat answered by a real chat worker shows up in its scrape, merged from the host's
multiprocess directory, without the gateways' queue depths; a missing directory is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import websockets

from tests.integration.conftest import Client, Services, make_stack
from tests.support import ROOT, free_port, port_open, wait_until


async def test_a_worker_hosts_series_are_served_without_a_gateway(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    with make_stack(services, migrated, tmp_path, metrics_dir=str(metrics_dir)) as stack:
        stack.wait_ready()
        stack.wait_worker("chat0")
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
            client = Client(ws)
            await client.chat("m1", "a question for the metrics", cache=False)
            _, end = await client.until_end("m1")
        assert end["type"] == "done", end
        port = free_port()
        stack.start("metrics", ["-m", "firsttoken", "metrics-server", "--host", "127.0.0.1",
                                "--port", str(port)])  # fmt: skip
        wait_until(lambda: port_open(port), 20, what="metrics-server")
        text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    capacity = [line for line in lines if line.startswith("firsttoken_worker_capacity{")]
    assert capacity and all(float(line.rsplit(" ", 1)[1]) > 0 for line in capacity), capacity
    ok = [line for line in lines if line.startswith('firsttoken_chats_total{status="ok"}')]
    assert ok and float(ok[0].rsplit(" ", 1)[1]) >= 1, ok
    assert not any(line.startswith("firsttoken_queue_depth") for line in lines)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def test_the_server_refuses_to_start_without_a_directory(tmp_path: Path) -> None:
    env = {**os.environ, "FIRSTTOKEN_METRICS_DIR": str(tmp_path / "absent")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "metrics-server", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2 and "FIRSTTOKEN_METRICS_DIR" in proc.stderr, proc.stderr
