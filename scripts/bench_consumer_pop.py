"""CPU of one chat-queue read by `workers/consumer.py`: one BRPOP against the batched read.

    python scripts/bench_consumer_pop.py --reads 3000 --repeats 3

Pushes `--waiting` kombu-sized messages (900 bytes) onto a list of its own, then times the
process CPU (not wall time: Redis's share is not counted) of `QueueConsumer._pop` taking them
off the four priority lists: with a count of 1 (one BRPOP per message) and of 4 (a BRPOP
pipelined with the script that pops up to 3 more). With one waiting (the default, as at low
load) that is what the batched read costs; with 4 (a queue that outruns the workers), what it
saves. Prints CPU per message. Alternates the two per repeat; deletes its keys at the end. (Up
to session 15 this script compared redis-py's BLMPOP with one on a RedisPipe: BENCHMARKS.md,
Session 11. Up to session 16 the consumer read through redis-py's client: 45-52 µs a read on
session 17's host, against 28-32 on its own connection.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis.asyncio as aioredis
import uvloop

from workers.consumer import PICKUP_BATCH, QueueConsumer, priority_lists

MESSAGE = "x" * 900


async def _measure(url: str, reads: int, repeats: int, waiting: int) -> dict[str, list[float]]:
    client = aioredis.Redis.from_url(url, socket_timeout=None)
    lists = priority_lists(f"ftbenchpop{uuid.uuid4().hex[:8]}")
    consumer = QueueConsumer(client, lists, {}, PICKUP_BATCH, poll_s=1.0, batch=PICKUP_BATCH)
    out: dict[str, list[float]] = {"BRPOP": [], f"batched ({PICKUP_BATCH})": []}
    try:
        for _ in range(repeats):
            for name, count in zip(out, (1, PICKUP_BATCH), strict=True):
                cpu = 0.0
                for _ in range(reads):
                    await client.lpush(lists[0], *([MESSAGE] * waiting))
                    taken = 0
                    start = time.process_time()
                    while taken < waiting:
                        taken += len(await consumer._pop(count))
                    cpu += time.process_time() - start
                out[name].append(cpu / (reads * waiting) * 1e6)
    finally:
        await consumer.aclose()
        await client.delete(*lists)
        await client.aclose()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0", help="Redis to read from")
    p.add_argument("--reads", type=int, default=3000, help="reads per kind per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--waiting", type=int, default=1, help="messages waiting at each read")
    args = p.parse_args()
    if args.reads < 1 or args.repeats < 1 or args.waiting < 1:
        p.error("--reads, --repeats and --waiting must be at least 1")
    results = uvloop.run(_measure(args.url, args.reads, args.repeats, args.waiting))
    for name, values in results.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:>12}: {statistics.median(values):.1f} µs CPU per message (median; {each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
