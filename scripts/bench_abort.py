"""Cancellation and vLLM benchmarks (issue 3), printed as Markdown for BENCHMARKS.md.

1. Time from client disconnect (websocket closed mid-answer) to engine abort, p50/p99:
   - simulator: the sim-server's ``firsttoken_sim_last_abort_timestamp_seconds`` (wall clock at
     the moment its engine let go of the request) minus the wall-clock time of the close;
   - vLLM-CPU: ``vllm:num_requests_running`` scraped back to back until it reads 0 (includes
     up to one scrape of lag; the scrape time is reported).
2. Time to first token and tokens/s through the stack vs straight to vLLM-CPU, alternating
   request by request in the same run, and the ratio stack/direct.

    python scripts/bench_abort.py [--aborts 50] [--requests 20] [--no-vllm]

Needs Redis on 127.0.0.1:6379 (or FIRSTTOKEN_TEST_REDIS_URL); the database is a temporary SQLite
file. The vLLM part needs the venv of scripts/vllm_env.sh. Reuses the integration tests' stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.conftest import (  # noqa: E402
    Services,
    Stack,
    _migrate_and_key,
    make_stack,
)
from tests.support import REDIS_URL, redis_available  # noqa: E402
from tests.vllm.conftest import (  # noqa: E402
    MODEL_DIR,
    SERVED,
    VENV_PYTHON,
    VLLMServer,
    start_vllm_server,
    vllm_available,
    vllm_env,
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return f"p50 {pct(values, 50):.1f} · p99 {pct(values, 99):.1f} · max {max(values):.1f}"


async def _start_chat(stack: Stack, max_tokens: int, tokens_before: int = 2) -> Any:
    """A websocket with one chat that has produced ``tokens_before`` token frames."""
    ws = await websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {stack.api_key}"}
    )
    await ws.send(
        json.dumps(
            {
                "type": "chat",
                "id": "a",
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"w1 w2 {uuid.uuid4().hex}"}],
            }
        )
    )
    seen = 0
    while seen < tokens_before:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if frame["type"] == "token":
            seen += 1
        elif frame["type"] in ("done", "error"):
            raise RuntimeError(f"chat ended before the disconnect: {frame}")
    return ws


def _sim_metric(stack: Stack, name: str) -> float:
    return stack.sim_metric(name)


async def sim_aborts(stack: Stack, n: int) -> tuple[list[float], int]:
    """Disconnect → abort times (ms), and how many disconnects never aborted the request."""
    out, lost = [], 0
    for _ in range(n):
        ws = await _start_chat(stack, 2000)
        before = _sim_metric(stack, "firsttoken_sim_last_abort_timestamp_seconds")
        closed_at = time.time()
        await ws.close()
        while True:
            at = _sim_metric(stack, "firsttoken_sim_last_abort_timestamp_seconds")
            if at != before:
                out.append((at - closed_at) * 1000)
                break
            if _sim_metric(stack, "firsttoken_sim_requests_running") == 0:
                # Aborted between the two reads, or ran to its end (the cancel was lost).
                at = _sim_metric(stack, "firsttoken_sim_last_abort_timestamp_seconds")
                if at != before:
                    out.append((at - closed_at) * 1000)
                else:
                    lost += 1
                break
            await asyncio.sleep(0.002)
    return out, lost


async def vllm_aborts(stack: Stack, server: VLLMServer, n: int) -> tuple[list[float], int, float]:
    """Disconnect → running 0 (ms); disconnects whose request ran to its end; scrape ms."""
    out: list[float] = []
    scrape: list[float] = []
    lost = 0
    async with httpx.AsyncClient() as http:
        metrics = f"http://127.0.0.1:{server.port}/metrics"

        async def read(prefix: str) -> float:
            t = time.perf_counter()
            text = (await http.get(metrics)).text
            scrape.append((time.perf_counter() - t) * 1000)
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(prefix)
            )

        async def running() -> float:
            return await read("vllm:num_requests_running{")

        async def completed() -> float:
            return await read('vllm:request_success_total{engine="0",finished_reason="length"')

        for _ in range(n):
            ws = await _start_chat(stack, 15000)
            done_before = await completed()
            closed_at = time.perf_counter()
            await ws.close()
            while await running() != 0:
                pass
            took = (time.perf_counter() - closed_at) * 1000
            if await completed() > done_before:
                lost += 1  # it ran to its end (15000 tokens): the cancel never reached vLLM
            else:
                out.append(took)
    return out, lost, statistics.median(scrape)


async def stack_request(stack: Stack, max_tokens: int) -> tuple[float, float, int]:
    """(ttft ms, tokens/s over the whole request, completion tokens) through the stack.

    Whole-request rate, not after-first-token: vLLM-CPU sends the tiny model's answer in a
    few bursts, so a rate over the tail after the first chunk is mostly noise."""
    async with websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {stack.api_key}"}
    ) as ws:
        start = time.perf_counter()
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "id": "t",
                    "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"w3 w4 {uuid.uuid4().hex}"}],
                }
            )
        )
        first = 0.0
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if frame["type"] == "token" and not first:
                first = time.perf_counter()
            elif frame["type"] == "done":
                end = time.perf_counter()
                tokens = int(frame["usage"]["completion_tokens"])
                return (first - start) * 1000, tokens / (end - start), tokens
            elif frame["type"] == "error":
                raise RuntimeError(frame)


async def direct_request(
    http: httpx.AsyncClient, server: VLLMServer, max_tokens: int
) -> tuple[float, float, int]:
    """The same measurement straight against vLLM's OpenAI endpoint."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": f"w3 w4 {uuid.uuid4().hex}"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with http.stream("POST", server.url + "/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content") and not first:
                    first = time.perf_counter()
    end = time.perf_counter()
    return (first - start) * 1000, tokens / (end - start), tokens


async def compare(stack: Stack, server: VLLMServer, n: int, max_tokens: int) -> dict[str, Any]:
    rows: dict[str, list[tuple[float, float, int]]] = {"stack": [], "direct": []}
    async with httpx.AsyncClient(timeout=60) as http:
        await direct_request(http, server, 8)  # warm both paths
        await stack_request(stack, 8)
        for _ in range(n):
            rows["direct"].append(await direct_request(http, server, max_tokens))
            rows["stack"].append(await stack_request(stack, max_tokens))
    out: dict[str, Any] = {}
    for name, values in rows.items():
        out[name] = {
            "ttft_p50": statistics.median(v[0] for v in values),
            "ttft_p99": pct([v[0] for v in values], 99),
            "tps_p50": statistics.median(v[1] for v in values),
            "tokens": statistics.median(v[2] for v in values),
        }
    out["ttft_ratio"] = out["stack"]["ttft_p50"] / out["direct"]["ttft_p50"]
    out["tps_ratio"] = out["stack"]["tps_p50"] / out["direct"]["tps_p50"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--aborts", type=int, default=50, help="disconnects measured per engine")
    p.add_argument("--requests", type=int, default=20, help="requests per path in the comparison")
    p.add_argument("--max-tokens", type=int, default=64, help="answer length in the comparison")
    p.add_argument("--no-vllm", action="store_true", help="simulator only")
    args = p.parse_args()
    if not redis_available():
        print(f"needs Redis at {REDIS_URL}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-abort-"))
    services = Services(REDIS_URL, f"sqlite+aiosqlite:///{tmp / 'db.sqlite3'}", [])
    key = _migrate_and_key(services.database_url)
    report = [f"Run at {time.strftime('%Y-%m-%d %H:%M')}, `{' '.join(sys.argv)}`", ""]

    sim_args = ("--ttft-ms", "20", "--itl-ms", "5", "--max-tokens", "2000")
    with make_stack(services, key, tmp, sim_args=sim_args) as stack:
        stack.wait_ready()
        sim, sim_lost = asyncio.run(sim_aborts(stack, args.aborts))
    report.append(
        f"- simulator, disconnect → engine abort (ms, n={len(sim)}): {summary(sim)}; "
        f"disconnects that never aborted: {sim_lost} of {args.aborts}"
    )

    if not args.no_vllm:
        if not vllm_available():
            print("no vLLM venv: run scripts/vllm_env.sh (or pass --no-vllm)", file=sys.stderr)
            return 2
        import subprocess

        subprocess.run(
            [str(VENV_PYTHON), str(ROOT / "tests/vllm/tinymodel.py"), str(MODEL_DIR)],
            check=True,
            env=vllm_env(),
            capture_output=True,
        )
        server = start_vllm_server(MODEL_DIR, tmp / "vllm.log")
        try:
            models = json.dumps([{"name": SERVED, "engine": "openai", "url": server.url}])
            with make_stack(
                services,
                key,
                tmp,
                models=models,
                first_token_deadline_s="10",
                engine_idle_timeout_s="10",
                stream_idle_timeout_s="20",
                max_tokens_limit="15000",
            ) as stack:
                stack.wait_ready()
                aborts, vllm_lost, scrape_ms = asyncio.run(vllm_aborts(stack, server, args.aborts))
                cmp = asyncio.run(compare(stack, server, args.requests, args.max_tokens))
        finally:
            server.proc.stop(timeout=20)
        report.append(
            f"- vLLM-CPU, disconnect → `vllm:num_requests_running` 0 (ms, n={len(aborts)}): "
            f"{summary(aborts)} (one /metrics scrape takes ~{scrape_ms:.1f} ms); disconnects "
            f"that never aborted: {vllm_lost} of {args.aborts}"
        )
        report += [
            "",
            f"TTFT and decode speed, tiny model, {args.max_tokens} tokens, {args.requests} "
            "requests per path, alternating, one at a time:",
            "",
            "| path | TTFT p50 ms | TTFT p99 ms | tokens/s p50, whole request | tokens |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name in ("direct", "stack"):
            r = cmp[name]
            report.append(
                f"| {name} | {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['tps_p50']:.0f} | "
                f"{r['tokens']:.0f} |"
            )
        report += [
            "",
            f"Ratio stack/direct: TTFT x{cmp['ttft_ratio']:.2f}, tokens/s x{cmp['tps_ratio']:.2f}",
        ]
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
