"""CPU of the `openai` engine's client per request and per token, against aiohttp's, in turn.

    python scripts/bench_engine_client.py --repeats 3

Starts the simulator (`shared.simserver`, no time to first token, ``--itl-ms`` between tokens)
and streams chat completions from it in this process: through ``OpenAIEngine`` (its own HTTP/1.1
client, shared/engines/httpstream.py), and through an aiohttp session reading the same events
the way the engine did until session 12 (``iter_any`` reads, the same SSE split, one
``json.loads`` per event). Prints this process's CPU per request (one-token answers, sequential
and ``--concurrency`` at once) and per token (``--tokens``-token answers), medians over
``--repeats`` rounds that alternate the two clients. It is the cost a chat worker pays on the
engine hop: in front of every first token, and again for every token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from firsttoken.bench.direct import streaming_session  # noqa: E402
from shared.engines.base import EngineRequest  # noqa: E402
from shared.engines.httpstream import sse_payloads  # noqa: E402
from shared.engines.openai_engine import OpenAIEngine  # noqa: E402
from shared.protocol import Message  # noqa: E402
from shared.settings import Settings  # noqa: E402

PROMPT = "What is the capital of France? Tell me more about it."
Stream = Callable[[int], AsyncIterator[str]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_client(url: str) -> tuple[Stream, Callable[[], Awaitable[None]]]:
    engine = OpenAIEngine(Settings(engine="openai", engine_url=url))
    count = 0

    async def stream(max_tokens: int) -> AsyncIterator[str]:
        nonlocal count
        count += 1
        request = EngineRequest([Message(role="user", content=PROMPT)], "sim", max_tokens)
        async for delta in engine.stream(request, request_id=f"r{count}"):
            if delta.text:
                yield delta.text

    return stream, engine.aclose


def aiohttp_client(url: str) -> tuple[Stream, Callable[[], Awaitable[None]]]:
    session: aiohttp.ClientSession | None = None
    headers = {"Authorization": "Bearer EMPTY", "Content-Type": "application/json"}

    async def stream(max_tokens: int) -> AsyncIterator[str]:
        nonlocal session
        if session is None:
            # The bench's direct-mode session: the reading the engine did until session 12.
            session = streaming_session(1000, aiohttp.ClientTimeout(total=None))
        body: dict[str, Any] = {
            "model": "sim",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(
            url + "/chat/completions", data=json.dumps(body).encode(), headers=headers
        ) as response:
            pending = b""
            async for chunk in response.content.iter_any():
                payloads, pending = sse_payloads(pending, chunk)
                for data in payloads:
                    if data == b"[DONE]":
                        return
                    for choice in json.loads(data).get("choices") or ():
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            yield content

    async def close() -> None:
        if session is not None:
            await session.close()

    return stream, close


async def _cpu_per(stream: Stream, n: int, concurrency: int, max_tokens: int) -> tuple[float, int]:
    """This process's CPU for n requests (µs per request) and the tokens they gave."""
    slots = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one() -> None:
        nonlocal tokens
        async with slots:
            async for _ in stream(max_tokens):
                tokens += 1

    await asyncio.gather(*(one() for _ in range(min(n, 20))))  # warm connections
    tokens = 0
    start = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return 1e6 * (time.process_time() - start) / n, tokens


def start_sim(port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    timing = ["--ttft-ms", "0", "--itl-ms", str(args.itl_ms), "--jitter", "0"]
    timing += ["--max-tokens", str(args.tokens)]
    return subprocess.Popen(
        [sys.executable, "-m", "shared.simserver", "--port", str(port), *timing],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def main(args: argparse.Namespace) -> None:
    port = _free_port()
    sim = start_sim(port, args)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        clients = {"engine (httpstream)": engine_client, "aiohttp": aiohttp_client}
        rows: dict[str, dict[str, list[float]]] = {name: {} for name in clients}
        for round_ in range(args.repeats):
            for name, make in clients.items():
                stream, close = make(url)
                try:
                    one, _ = await _cpu_per(stream, args.requests, 1, 1)
                    many, _ = await _cpu_per(stream, args.requests, args.concurrency, 1)
                    long, tokens = await _cpu_per(stream, args.requests // 4, 20, args.tokens)
                finally:
                    await close()
                per_token = long * (args.requests // 4) / max(tokens, 1)
                for key, value in (("1", one), ("c", many), ("tok", per_token)):
                    rows[name].setdefault(key, []).append(value)
            print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        sim.terminate()
        sim.wait()
    print(f"CPU of this process (µs; median of {args.repeats}, each round's in brackets)")
    print(
        f"  {'client':<22}{'per request, 1 at a time':>28}"
        f"{f'per request, {args.concurrency} at once':>30}{'per token':>22}"
    )
    for name, cols in rows.items():
        cells = [
            f"{statistics.median(v):.0f} ({', '.join(f'{x:.0f}' for x in v)})"
            for v in (cols["1"], cols["c"], cols["tok"])
        ]
        print(f"  {name:<22}{cells[0]:>28}{cells[1]:>30}{cells[2]:>22}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--requests", type=int, default=2000, help="requests per measure (default %(default)s)"
    )
    p.add_argument(
        "--concurrency", type=int, default=20, help="requests at once in the second measure"
    )
    p.add_argument(
        "--tokens", type=int, default=64, help="tokens per answer in the per-token measure"
    )
    p.add_argument("--itl-ms", type=float, default=2.0, help="the simulator's ms between tokens")
    p.add_argument("--repeats", type=int, default=3, help="rounds, alternating the clients")
    args = p.parse_args(argv)
    if min(args.requests, args.concurrency, args.tokens, args.repeats) < 1 or args.requests < 4:
        p.error("--requests must be >= 4 and the other counts >= 1")
    return args


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(parse_args()))
