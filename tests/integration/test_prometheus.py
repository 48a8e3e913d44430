"""A real Prometheus server (Debian's `prometheus`) scraping a 2-gateway, 2-chat-worker stack
in multiprocess mode (shared/metrics/): its `histogram_quantile` over the time-to-first-token
histogram answers what the clients measured, and a scrape shows every process."""

from __future__ import annotations

import asyncio
import bisect
import json
import shutil
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import websockets

from shared.metrics.series import LATENCY_BUCKETS
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.prometheus]

PROMETHEUS = shutil.which("prometheus")
CHATS = 48
CONCURRENCY = 4  # few streams: the client's own loop adds little to what it measures
# A first token slow enough that a millisecond of websocket and client-loop time is small
# beside it (the gateway measures from the frame's arrival, the client from its send).
SIM_ARGS = ("--ttft-ms", "60", "--itl-ms", "2", "--max-tokens", "6")


def bucketed_quantile(q: float, samples: Sequence[float], bounds: Sequence[float]) -> float:
    """What Prometheus' histogram_quantile answers for `samples` put in buckets `bounds`
    (upper bounds, +Inf implied): the bucket holding rank q*n, interpolated linearly in it."""
    counts = [0] * (len(bounds) + 1)
    for value in samples:
        counts[bisect.bisect_left(bounds, value)] += 1  # le: a value on a bound is in it
    rank, below = q * len(samples), 0
    for i, count in enumerate(counts):
        if below + count >= rank and count:
            if i == len(bounds):
                return bounds[-1]  # the +Inf bucket: Prometheus answers the last bound
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    raise ValueError("no samples")


def containing_bucket(value: float, bounds: Sequence[float]) -> tuple[float, float]:
    i = bisect.bisect_left(bounds, value)
    return (bounds[i - 1] if i else 0.0), (bounds[i] if i < len(bounds) else float("inf"))


def test_bucketed_quantile_interpolates_as_prometheus_does() -> None:
    # 4 samples in (0.02, 0.03], rank 2 of 4: halfway through that bucket.
    assert bucketed_quantile(0.5, [0.021, 0.022, 0.025, 0.029], LATENCY_BUCKETS) == pytest.approx(
        0.025
    )
    assert containing_bucket(0.025, LATENCY_BUCKETS) == (0.02, 0.03)


class PrometheusServer:
    def __init__(self, workdir: Path, target_port: int) -> None:
        assert PROMETHEUS is not None
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: firsttoken\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture
def metrics_stack(services: Services, migrated: str, tmp_path: Path) -> Iterator[Stack]:
    """2 gateway processes on one port, 2 chat workers and a bulk worker, one metrics dir."""
    with make_stack(
        services,
        migrated,
        tmp_path,
        workers=2,
        gateway=False,
        sim_args=SIM_ARGS,
        metrics_dir=str(tmp_path / "metrics"),
    ) as stack:
        stack.start_gateway(2)
        gateways: set[str] = set()

        def both_ready() -> bool:
            status, body = stack.get("/readyz")
            if status == 200:
                gateways.add(json.loads(body)["gateway"])
            return len(gateways) == 2

        wait_until(both_ready, 60, what="both gateways ready")
        stack.wait_worker("chat0")
        stack.wait_worker("chat1")
        stack.wait_worker("bulk", "bulk")
        yield stack


@pytest.fixture
def prometheus(tmp_path: Path, metrics_stack: Stack) -> Iterator[PrometheusServer]:
    if PROMETHEUS is None:
        pytest.skip("no `prometheus` binary (apt-get install -y prometheus; see .ci/run)")
    server = PrometheusServer(tmp_path, metrics_stack.gateway_port)
    try:
        wait_until(lambda: server.proc.poll() is None and server.ready(), 30, what="prometheus")
        yield server
    except BaseException:
        print((tmp_path / "prometheus.log").read_text(errors="replace")[-3000:])
        raise
    finally:
        server.close()


async def _client_ttfts(stack: Stack) -> list[float]:
    """Each chat's time to first token as its client saw it: from the chat frame's send to its
    first token frame's arrival (uncached, so every one goes through the engine)."""
    ttfts: list[float] = []
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    async def one_client(n: int) -> None:
        async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
            for i in range(CHATS // CONCURRENCY):
                chat_id = f"p{n}-{i}"
                frame = {
                    "type": "chat",
                    "id": chat_id,
                    "cache": False,
                    "messages": [{"role": "user", "content": f"question {n} {i}"}],
                }
                sent = time.perf_counter()
                await ws.send(json.dumps(frame))
                first: float | None = None
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 15))
                    if msg.get("id") != chat_id:
                        continue
                    if msg["type"] == "token" and first is None:
                        first = time.perf_counter() - sent
                    if msg["type"] in ("done", "error"):
                        assert msg["type"] == "done", msg
                        break
                assert first is not None
                ttfts.append(first)

    await asyncio.gather(*(one_client(n) for n in range(CONCURRENCY)))
    return ttfts


async def test_prometheus_answers_the_clients_median_ttft_and_sees_every_process(
    metrics_stack: Stack, prometheus: PrometheusServer
) -> None:
    stack = metrics_stack
    # The series exist at zero before the first chat (the gateway makes them for its model
    # table), and a scrape has seen them so: rate() then counts every chat from zero.
    bucket = "firsttoken_time_to_first_token_seconds_bucket"
    wait_until(lambda: bool(prometheus.query(bucket)), 30, what="the TTFT series scraped")
    ttfts = await _client_ttfts(stack)
    assert len(ttfts) == CHATS

    # Every chat observed, in some scrape after the last one ended.
    count = "sum(firsttoken_time_to_first_token_seconds_count)"
    wait_until(lambda: prometheus.scalar(count) == CHATS, 30, what=f"{CHATS} chats scraped")
    # Only the zero-born series took chats (a model name outside the table would start a new
    # series mid-run, whose first chats rate() cannot see).
    born = prometheus.query(f'{bucket}{{le="+Inf"}} > 0')
    assert len(born) == 1, born

    # What an operator asks. Why the comparison below is fair: Prometheus knows only bucket
    # counts and interpolates linearly inside the bucket holding the median, so its answer can
    # sit anywhere in that bucket whatever the true median is. The clients' own TTFTs, put in
    # the same buckets and interpolated the same way, are what it would answer if it had
    # measured exactly what the clients did; it measured from the frame's arrival to the first
    # token's write (a millisecond or so less), so the two must agree within 10%. rate()
    # scales every bucket alike here (all were scraped at zero first), so the ratios hold.
    promql = (
        "histogram_quantile(0.5, "
        "sum(rate(firsttoken_time_to_first_token_seconds_bucket[5m])) by (le))"
    )
    answered = prometheus.scalar(promql)
    assert answered is not None
    expected = bucketed_quantile(0.5, ttfts, LATENCY_BUCKETS)
    median = statistics.median(ttfts)
    lower, upper = containing_bucket(median, LATENCY_BUCKETS)
    detail = (
        f"prometheus p50 {answered * 1000:.2f} ms; clients' median {median * 1000:.2f} ms in "
        f"bucket ({lower * 1000:g}, {upper * 1000:g}] ms, bucketed {expected * 1000:.2f} ms"
    )
    print(detail)
    assert abs(answered - expected) <= 0.10 * expected, detail
    assert lower * 0.9 <= answered <= upper * 1.1, detail

    # One scrape covers the whole host: each gateway process and each worker process is there
    # by its pid (the merge labels the live-process gauge with host-pid), and both chat
    # workers report their capacity.
    status, text = stack.get("/metrics")
    assert status == 200
    pids = {
        role: {
            sample["metric"]["pid"].rsplit("-", 1)[-1]
            for sample in prometheus.query(f'firsttoken_process{{role="{role}"}}')
        }
        for role in ("gateway", "worker")
    }
    gateway_pids = {str(stack.procs[name].pid) for name in ("gateway0", "gateway1")}
    worker_pids = {str(stack.procs[name].pid) for name in ("chat0", "chat1", "bulk")}
    assert pids["gateway"] == gateway_pids, pids
    assert pids["worker"] == worker_pids, pids
    capacity = prometheus.query("firsttoken_worker_capacity")
    workers = {sample["metric"]["worker"].split("-", 1)[0] for sample in capacity}
    assert workers == {"chat0", "chat1"}, capacity
    for series in (
        "firsttoken_queue_wait_seconds_bucket",
        "firsttoken_stage_seconds_bucket",
        "firsttoken_time_per_output_token_seconds_bucket",
        "firsttoken_tokens_total",
        "firsttoken_chats_total",
        "firsttoken_queue_depth",
        "firsttoken_worker_chats_in_flight",
        "firsttoken_gateway_chats_total",
    ):
        assert series in text, series
    ok = prometheus.scalar('sum(firsttoken_chats_total{status="ok"})')
    assert ok == CHATS
