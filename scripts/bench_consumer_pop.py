"""CPU of one chat-queue read: redis-py (as workers/consumer.py reads) against a RedisPipe.

    python scripts/bench_consumer_pop.py --reads 3000 --repeats 3

Pushes one kombu-sized message (900 bytes) onto a list of its own, then times the process CPU
(not wall time: Redis's share is not counted) of reading it with BLMPOP over the four priority
lists, as `workers/consumer.py` does, once through `redis.asyncio` and once through
`shared.redispipe.RedisPipe`. Alternates the two per repeat; deletes its keys at the end.
Session 11 measured the consumer on a pipe this way and end to end (BENCHMARKS.md): 17-40 µs
less CPU per read, not visible end to end, not adopted.
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

from shared.redispipe import RedisPipe
from workers.consumer import priority_lists

MESSAGE = "x" * 900


async def _measure(url: str, reads: int, repeats: int) -> dict[str, list[float]]:
    client = aioredis.Redis.from_url(url, socket_timeout=None)
    pipe = RedisPipe(url, client_name="bench-consumer-pop")
    await pipe.start()
    lists = priority_lists(f"ftbenchpop{uuid.uuid4().hex[:8]}")
    out: dict[str, list[float]] = {"redis-py": [], "pipe": []}
    try:
        for _ in range(repeats):
            for name in out:
                cpu = 0.0
                for _ in range(reads):
                    await pipe.call("LPUSH", lists[0], MESSAGE)
                    start = time.process_time()
                    if name == "redis-py":
                        popped = await client.blmpop(
                            1.0, len(lists), *lists, direction="RIGHT", count=4
                        )
                    else:
                        popped = await pipe.call(
                            "BLMPOP", "1", str(len(lists)), *lists, "RIGHT", "COUNT", "4"
                        )
                    cpu += time.process_time() - start
                    if popped is None or len(popped[1]) != 1:  # type: ignore[index]
                        raise RuntimeError(f"expected one message, got {popped!r}")
                out[name].append(cpu / reads * 1e6)
    finally:
        await client.delete(*lists)
        await client.aclose()
        await pipe.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0", help="Redis to read from")
    p.add_argument("--reads", type=int, default=3000, help="reads per client per repeat")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.reads < 1 or args.repeats < 1:
        p.error("--reads and --repeats must be at least 1")
    results = uvloop.run(_measure(args.url, args.reads, args.repeats))
    for name, values in results.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:>9}: {statistics.median(values):.1f} µs CPU per read (median; {each})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
