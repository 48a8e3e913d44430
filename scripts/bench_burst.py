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
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import websockets

from firsttoken.bench.profiles import get_profile
from firsttoken.bench.stack import BenchStack, cpu_seconds


async def _chat(ws: Any, chat_id: str) -> bool:
    await ws.send(
        json.dumps(
            {
                "type": "chat",
                "id": chat_id,
                "messages": [{"role": "user", "content": f"burst question {chat_id}"}],
                "cache": False,
                "max_tokens": 1,
            }
        )
    )
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] in ("done", "error"):
            return bool(frame["type"] == "done")


async def _measure(stack: BenchStack, streams: int, bursts: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    conns = [
        await websockets.connect(stack.ws_url, additional_headers=headers) for _ in range(streams)
    ]
    try:
        for i, ws in enumerate(conns):
            await _chat(ws, f"warm{i}")
        pids = stack.pids()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        answered = 0
        for b in range(bursts):
            done = await asyncio.gather(*(_chat(ws, f"b{b}-{i}") for i, ws in enumerate(conns)))
            answered += sum(done)
            await asyncio.sleep(0.2)  # let the tail (usage rows, unsubscribes) settle
        if answered < streams * bursts:
            raise RuntimeError(f"only {answered} of {streams * bursts} chats were answered")
        return {
            name: (cpu_seconds(pid) - before[name]) * 1000 / answered for name, pid in pids.items()
        }
    finally:
        for ws in conns:
            await ws.close()


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
