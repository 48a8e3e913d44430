"""The timeline of a closed loop's first wave: when each chat of a burst reached each stage.

    python bench/wave.py --streams 200 --bursts 5

Starts the bench's stack (the simulator, `--workers` chat workers, a bulk worker, one gateway),
opens `--streams` websocket connections, warms each with one chat, then sends `--bursts`
bursts of one chat per connection at once (one-token answers, cache off), 1.5 s apart. Each
chat's `done` frame carries its stage timings (shared/timing.py); with the client's own send
and first-token times they place every chat on one time line from the burst's start: sent
by the client, taken up by the gateway (`received`), picked up by a chat worker
(`worker_start`), engine request out (`retrieval_done`), first token at the client. Prints,
per burst, how many chats had passed each point every 5 ms, and the mean time line of the 20
slowest: where the last chats of a burst wait.

The gateway's `received` is placed from the client's first-token time minus the gateway's own
`ttft_ms`, so it is late by the relay to the client.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from firsttoken.bench.loadgen import StackClient
from firsttoken.bench.profiles import get_profile
from firsttoken.bench.stack import BenchStack
from firsttoken.bench.stats import RequestResult

POINTS = ("sent", "received", "picked_up", "engine_request", "first_token")


def timeline(result: RequestResult, t0: float) -> dict[str, float]:
    """One chat's points in ms from the burst's start (t0, the client's perf_counter)."""
    t = result.server_timings
    if result.ttft_ms is None or not t:
        raise RuntimeError(f"a chat of the burst failed: {result.error or 'no timings'}")
    sent = (result.start_s - t0) * 1000
    first = sent + result.ttft_ms
    received = first - t["ttft_ms"]
    picked = received + t["accept_ms"] + t["queue_ms"]
    return {
        "sent": sent,
        "received": received,
        "picked_up": picked,
        "engine_request": picked + t["retrieval_ms"],
        "first_token": first,
    }


def report(burst: int, rows: list[dict[str, float]], step_ms: float = 5.0) -> str:
    lines = [f"burst {burst + 1}: chats past each point, by ms from the burst's start"]
    end = max(r["engine_request"] for r in rows)
    t = 0.0
    while t <= end + step_ms:
        counts = " ".join(f"{p} {sum(r[p] < t for r in rows):3d}" for p in POINTS[:4])
        lines.append(f"  {t:5.0f} ms  {counts}")
        t += step_ms
    slow = sorted(rows, key=lambda r: r["first_token"])[-20:]
    means = ", ".join(f"{p} {statistics.mean(r[p] for r in slow):.1f}" for p in POINTS)
    lines.append(f"  the 20 slowest, mean ms: {means}")
    return "\n".join(lines)


async def _run(stack: BenchStack, streams: int, bursts: int) -> None:
    client = StackClient(
        stack.ws_url, stack.api_key, connections=streams, max_tokens=1, cache=False
    )
    await client.open()
    try:
        await asyncio.gather(*(client.send(f"warm {i}") for i in range(streams)))
        for b in range(bursts):
            await asyncio.sleep(1.5)
            t0 = time.perf_counter()  # the clock of RequestResult.start_s
            results = await asyncio.gather(
                *(client.send(f"wave question {b}-{i}") for i in range(streams))
            )
            print(report(b, [timeline(r, t0) for r in results]), flush=True)
    finally:
        await client.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=200, help="connections, one chat each per burst")
    p.add_argument("--bursts", type=int, default=5, help="bursts (default: 5)")
    p.add_argument("--workers", type=int, default=2, help="chat worker processes (default: 2)")
    args = p.parse_args()
    if args.streams < 1 or args.bursts < 1:
        p.error("--streams and --bursts must be at least 1")
    stack = BenchStack(get_profile("chat-8b"), workers=args.workers)
    try:
        stack.start_stack()
        asyncio.run(_run(stack, args.streams, args.bursts))
    finally:
        stack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
