"""Retrieval stage time: three sources of 200, 350 and 50 ms, serial vs parallel.

    python scripts/bench_retrieval.py [--runs 20]

Uses the stage's own runner (shared.retrieval.gather_sources, each source under wait_for with
its deadline) and the naive serial loop over the same sources. Sources sleep (asyncio), i.e.
stand for I/O waits: a database query, a vector search service, a Redis read.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from shared.retrieval import Query, gather_sources, run_serially


class Sleeper:
    def __init__(self, name: str, ms: float, deadline_ms: float = 1000.0) -> None:
        self.name = name
        self.sleep_s = ms / 1000.0
        self.deadline_s = deadline_ms / 1000.0

    async def fetch(self, query: Query) -> str:
        await asyncio.sleep(self.sleep_s)
        return self.name


async def measure(runs: int) -> None:
    sources = [Sleeper("user_db", 200), Sleeper("kb_search", 350), Sleeper("quota", 50)]
    query = Query("tenant", "question")
    results: dict[str, list[float]] = {"serial": [], "parallel": []}
    for _ in range(runs):
        for label, runner in (("serial", run_serially), ("parallel", gather_sources)):
            start = time.perf_counter()
            await runner(sources, query)
            results[label].append((time.perf_counter() - start) * 1000.0)
    # One slow source past its deadline: the stage ends at the deadline, not the source.
    late = [Sleeper("user_db", 200), Sleeper("kb_search", 2000, deadline_ms=300)]
    capped = []
    for _ in range(runs):
        start = time.perf_counter()
        out = await gather_sources(late, query)
        capped.append((time.perf_counter() - start) * 1000.0)
    assert out["kb_search"].status == "timeout"
    print(f"runs={runs} sources=200/350/50 ms")
    for label, values in results.items():
        print(f"{label:9s} median={statistics.median(values):7.1f} ms  "
              f"min={min(values):7.1f}  max={max(values):7.1f}")  # fmt: skip
    print(f"late source (2000 ms, deadline 300 ms): median={statistics.median(capped):.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    asyncio.run(measure(ap.parse_args().runs))


if __name__ == "__main__":
    main()
