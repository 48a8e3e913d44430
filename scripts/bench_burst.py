"""CPU per chat of each stack process when chats arrive in bursts (a closed loop's first wave).

    python scripts/bench_burst.py --streams 50 --bursts 20 --repeats 3

Starts the bench's stack (the simulator, `--workers` chat workers, a bulk worker, one gateway)
on the machine's Redis and PostgreSQL (else the embedded defaults), opens `--streams` websocket
connections and warms each with one chat, then sends `--bursts` bursts of one chat per
connection at once (one-token answers, cache off), waiting for every answer before the next.
Prints the CPU each process spent per chat. With one-token answers nearly all of it is
per-chat work (frame, admission, queue, prompt, engine request, `accepted`, `started`, `done`):
the work a burst waits on, one chat at a time in each process. Less noisy than latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from firsttoken.bench.loadgen import StackClient
from firsttoken.bench.profiles import get_profile
from firsttoken.bench.stack import BenchStack, cpu_seconds


async def _measure(stack: BenchStack, streams: int, bursts: int) -> dict[str, float]:
    client = StackClient(
        stack.ws_url, stack.api_key, connections=streams, max_tokens=1, cache=False
    )
    await client.open()
    try:
        # One chat per connection at a time: the client spreads a burst over its connections.
        await asyncio.gather(*(client.send(f"warm {i}") for i in range(streams)))
        pids = stack.pids()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        answered = 0
        for b in range(bursts):
            results = await asyncio.gather(
                *(client.send(f"burst question {b}-{i}") for i in range(streams))
            )
            answered += sum(r.error is None for r in results)
            await asyncio.sleep(0.2)  # let the tail (usage rows, unsubscribes) settle
        if answered < streams * bursts:
            raise RuntimeError(f"only {answered} of {streams * bursts} chats were answered")
        return {
            name: (cpu_seconds(pid) - before[name]) * 1000 / answered for name, pid in pids.items()
        }
    finally:
        await client.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=50, help="connections, one chat each per burst")
    p.add_argument("--bursts", type=int, default=20, help="bursts per repeat (default: 20)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="chat worker processes (default: 2)")
    args = p.parse_args()
    stack = BenchStack(get_profile("chat-8b"), workers=args.workers)
    try:
        stack.start_stack()
        runs = [
            asyncio.run(_measure(stack, args.streams, args.bursts)) for _ in range(args.repeats)
        ]
    finally:
        stack.close()
    print(f"CPU per chat in bursts of {args.streams} (ms; median over {args.repeats} repeats)")
    for name in runs[0]:
        values = [r[name] for r in runs]
        spread = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:14s} {statistics.median(values):.3f}  ({spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
