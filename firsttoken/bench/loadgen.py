"""The async load generator: a prompt mix, closed- and open-loop drivers, and the websocket
client that speaks firsttoken's protocol.

A *sender* is ``async (prompt) -> RequestResult``; a driver calls senders at a given
concurrency (closed loop: N virtual users back to back) or at a Poisson rate (open loop:
arrivals do not wait for answers, so a slow server cannot slow the offered load down).
The ``direct`` and ``naive`` modes plug their own senders into the same drivers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from firsttoken.bench.stats import RequestResult

try:  # orjson parses a token frame several times faster; the load generator must stay cheap
    import orjson

    _loads: Callable[[str | bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

Sender = Callable[[str], Awaitable[RequestResult]]

# --- the prompt mix -------------------------------------------------------------------------

_TOPICS = (
    "reset my password",
    "change the billing address on my invoice",
    "export my data to CSV",
    "add a teammate to my workspace",
    "cancel my subscription",
    "enable two-factor login",
    "connect the Slack integration",
    "rotate an API key",
    "restore a deleted project",
    "raise my rate limit",
    "set up single sign-on",
    "download last month's receipts",
)
_ORIGINAL = "How do I {topic} (case {n})?"
_PARAPHRASES = (
    "What's the way to {topic}? (case {n})",
    "Could you tell me how to {topic}, case {n}?",
    "how do i {topic} - case {n}",
    "Steps to {topic} for case {n}, please.",
)


@dataclass
class PromptMix:
    """Questions for a run: fresh ones, exact repeats of earlier ones (``repeat_share``) and
    rewordings of earlier ones (``paraphrase_share``), drawn with a fixed seed so every mode
    of a run sees the same sequence."""

    repeat_share: float = 0.0
    paraphrase_share: float = 0.0
    seed: int = 7
    tag: str = ""
    _rng: random.Random = field(init=False)
    _seen: list[tuple[str, int]] = field(init=False, default_factory=list)
    _counter: itertools.count[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        if not (0 <= self.repeat_share <= 1 and 0 <= self.paraphrase_share <= 1):
            raise ValueError("repeat and paraphrase shares must be between 0 and 1")
        if self.repeat_share + self.paraphrase_share > 1:
            raise ValueError("repeat share + paraphrase share must not exceed 1")
        self._rng = random.Random(self.seed)

    def next(self) -> str:
        roll = self._rng.random()
        if self._seen and roll < self.repeat_share:
            topic, n = self._rng.choice(self._seen)
            return _ORIGINAL.format(topic=topic, n=n)
        if self._seen and roll < self.repeat_share + self.paraphrase_share:
            topic, n = self._rng.choice(self._seen)
            return self._rng.choice(_PARAPHRASES).format(topic=topic, n=n)
        # The tag keeps fresh questions of one run from being cache hits of an earlier run.
        n = next(self._counter)
        topic = self._rng.choice(_TOPICS)
        self._seen.append((topic, n))
        return _ORIGINAL.format(topic=topic, n=f"{self.tag}{n}")


# --- drivers --------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    results: list[RequestResult]
    wall_s: float
    client_cpu_s: float  # CPU this process spent in the run: the load generator's own cost

    @property
    def client_cpu_share(self) -> float:
        """Load-generator CPU as a share of one core (1.0 = one core saturated)."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else math.nan


class Progress:
    """A one-line progress display on stderr (only when it is a terminal, or when forced)."""

    def __init__(self, label: str, total: int | None, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.done = self.errors = 0
        self._t0 = time.monotonic()
        self._last = 0.0

    def tick(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += result.error is not None
        now = time.monotonic()
        if self.enabled and now - self._last > 0.5:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self._t0
        of = f"/{self.total}" if self.total else ""
        rate = self.done / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(
            f"\r  {self.label}: {self.done}{of} done, {self.errors} errors, "
            f"{rate:.1f} req/s, {elapsed:.0f}s "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            sys.stderr.write("\n")


async def drive(
    send: Sender,
    mix: PromptMix,
    *,
    concurrency: int,
    requests: int | None = None,
    duration_s: float | None = None,
    rate: float | None = None,
    seed: int = 11,
    progress: Progress | None = None,
) -> RunOutcome:
    """Run one load point. Closed loop (``rate`` None): ``concurrency`` users send back to back
    until ``requests`` are sent or ``duration_s`` has passed. Open loop: Poisson arrivals at
    ``rate`` per second, at most ``concurrency`` in flight (an arrival finding none free waits,
    and that wait counts in its latency: no coordinated omission)."""
    if requests is None and duration_s is None:
        raise ValueError("give requests or duration_s")
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    stop_at = t0 + duration_s if duration_s is not None else math.inf
    budget = requests if requests is not None else sys.maxsize

    async def one(prompt: str, arrival: float | None = None) -> None:
        result = await send(prompt)
        if arrival is not None:
            # Time spent waiting for a free slot after the arrival is part of the latency.
            wait_ms = (result.start_s - arrival) * 1000
            if wait_ms > 0.5:
                result.ttft_ms = None if result.ttft_ms is None else result.ttft_ms + wait_ms
                result.total_ms = None if result.total_ms is None else result.total_ms + wait_ms
                result.start_s = arrival
        result.start_s -= t0
        results.append(result)
        if progress:
            progress.tick(result)

    if rate is None:
        sent = 0

        async def user() -> None:
            nonlocal sent
            while sent < budget and time.perf_counter() < stop_at:
                sent += 1
                await one(mix.next())

        await asyncio.gather(*(user() for _ in range(concurrency)))
    else:
        rng = random.Random(seed)
        slots = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def arrive(prompt: str, arrival: float) -> None:
            async with slots:
                await one(prompt, arrival)

        next_at = t0
        for _ in range(budget):
            next_at += rng.expovariate(rate)
            if next_at >= stop_at:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(arrive(mix.next(), next_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    if progress:
        progress.close()
    return RunOutcome(sorted(results, key=lambda r: r.start_s), wall, time.process_time() - cpu0)


# --- the firsttoken websocket client --------------------------------------------------------


class _Pending:
    __slots__ = ("done", "last", "result", "t0")

    def __init__(self, result: RequestResult, t0: float) -> None:
        self.result = result
        self.t0 = t0
        self.last = t0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _Connection:
    """One websocket; several chats at once, frames routed by chat id by one reader task."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.pending: dict[str, _Pending] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = _loads(raw)
                p = self.pending.get(frame.get("id"))
                if p is None:
                    continue
                kind = frame["type"]
                r = p.result
                if kind == "token":
                    if r.ttft_ms is None:
                        r.ttft_ms = (now - p.t0) * 1000
                    else:
                        r.gaps_ms.append((now - p.last) * 1000)
                    p.last = now
                    r.chars += len(frame["text"])
                elif kind == "done" or kind == "error":
                    r.total_ms = (now - p.t0) * 1000
                    if kind == "done":
                        r.cached = bool(frame.get("cached"))
                        r.tokens = int(frame.get("usage", {}).get("completion_tokens", 0))
                        r.server_timings = frame.get("timings") or {}
                    else:
                        r.error = str(frame.get("code", "error"))
                    del self.pending[frame["id"]]
                    if not p.done.done():
                        p.done.set_result(None)
        except Exception:  # noqa: BLE001 - any end of the socket fails what is in flight
            pass
        for p in self.pending.values():
            if p.result.error is None:
                p.result.error = "connection_closed"
            if not p.done.done():
                p.done.set_result(None)
        self.pending.clear()


class StackClient:
    """Sends chats over a pool of websocket connections to a firsttoken gateway."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        connections: int,
        max_tokens: int | None,
        cache: bool,
        timeout_s: float = 120.0,
    ) -> None:
        self.url, self.api_key = url, api_key
        self.n_connections = max(1, connections)
        self.max_tokens, self.cache, self.timeout_s = max_tokens, cache, timeout_s
        self._conns: list[_Connection] = []
        self._rr = itertools.count()
        self._ids = itertools.count()

    async def open(self) -> None:
        import websockets

        async def connect() -> _Connection:
            ws = await websockets.connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.api_key}"},
                max_size=None,
                open_timeout=30,
                ping_interval=None,
                compression=None,
            )
            return _Connection(ws)

        # In batches: a thousand simultaneous handshakes would only measure the accept queue.
        while len(self._conns) < self.n_connections:
            batch = min(100, self.n_connections - len(self._conns))
            self._conns += await asyncio.gather(*(connect() for _ in range(batch)))

    async def close(self) -> None:
        for c in self._conns:
            await c.ws.close()
            c.reader.cancel()
        self._conns.clear()

    async def send(self, prompt: str) -> RequestResult:
        # Fewest chats in flight first, so a slow stream does not pile others behind it.
        conn = (
            min(self._conns, key=lambda c: len(c.pending))
            if len(self._conns) <= 8
            else self._conns[next(self._rr) % len(self._conns)]
        )
        chat_id = f"b{next(self._ids)}"
        frame: dict[str, Any] = {
            "type": "chat",
            "id": chat_id,
            "cache": self.cache,
            "messages": [{"role": "user", "content": prompt}],
        }
        if self.max_tokens:
            frame["max_tokens"] = self.max_tokens
        t0 = time.perf_counter()
        p = _Pending(RequestResult(start_s=t0), t0)
        conn.pending[chat_id] = p
        try:
            await conn.ws.send(json.dumps(frame))
            await asyncio.wait_for(asyncio.shield(p.done), self.timeout_s)
        except TimeoutError:
            p.result.error = "client_timeout"
            conn.pending.pop(chat_id, None)
        except Exception as exc:  # noqa: BLE001 - a send on a dead socket is an error result
            p.result.error = f"client_{type(exc).__name__}"
            conn.pending.pop(chat_id, None)
        return p.result
