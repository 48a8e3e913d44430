"""CPU per token of waking a task through nested async generators, against a plain callback.

    python scripts/bench_token_chain.py --tokens 200000 --levels 4 --repeats 3

A chat worker's token path wakes the chat's task once per token (the HTTP stream's read
callback resolves a future) and passes the token up through four nested async generators (the
engine's stream, the deadlines, the generation, the relay). This times that machinery alone on
uvloop, one token per turn of the loop, against a callback that hands the token straight on:
the most a callback path from `data_received` to the publisher could save per token, before
cache effects (BENCHMARKS.md, Session 16).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import uvloop


class _Feed:
    """Tokens put by a callback, awaited by a task (as the HTTP stream hands them over)."""

    def __init__(self) -> None:
        self._items: collections.deque[int | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: int | None) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> int | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()


async def _source(feed: _Feed) -> AsyncGenerator[int, None]:
    while (item := await feed.get()) is not None:
        yield item


async def _level(inner: AsyncIterator[int]) -> AsyncGenerator[int, None]:
    async for item in inner:
        yield item


async def _consume(chain: AsyncIterator[int], sink: Callable[[int], None]) -> None:
    async for item in chain:
        sink(item)


async def _one(tokens: int, levels: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    got: list[int] = []
    feed = _Feed()
    chain: AsyncIterator[int] = _source(feed)
    for _ in range(levels):
        chain = _level(chain)
    task = asyncio.create_task(_consume(chain, got.append))
    await asyncio.sleep(0)
    start = time.process_time()
    for i in range(tokens):
        loop.call_soon(feed.put, i)
        await asyncio.sleep(0)
    loop.call_soon(feed.put, None)
    await task
    through_chain = (time.process_time() - start) / tokens * 1e6
    direct: list[int] = []
    start = time.process_time()
    for i in range(tokens):
        loop.call_soon(direct.append, i)
        await asyncio.sleep(0)
    plain = (time.process_time() - start) / tokens * 1e6
    if len(got) != tokens or len(direct) != tokens:
        raise RuntimeError("tokens were lost")
    return through_chain, plain


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=200_000, help="tokens per repeat")
    p.add_argument("--levels", type=int, default=4, help="async generators above the source")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.tokens < 1 or args.levels < 0 or args.repeats < 1:
        p.error("--tokens and --repeats must be at least 1, --levels at least 0")
    runs = [uvloop.run(_one(args.tokens, args.levels)) for _ in range(args.repeats)]
    chain, plain = (statistics.median(r[i] for r in runs) for i in (0, 1))
    print(
        f"through {args.levels} async generators: {chain:.2f} µs CPU per token; "
        f"plain callback: {plain:.2f}; difference {chain - plain:.2f} (medians of {args.repeats})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
