"""The `direct` mode: the same load straight to the engine's OpenAI-compatible streaming API.

This is the floor: what a client would see with no gateway at all. The SSE stream is read
as raw bytes and its content deltas counted, not parsed (JSON only for the final usage event),
because the load generator has to stay far cheaper than the thing it measures. ``chars``
counts content deltas here, not characters. HTTP is aiohttp's (parsed in C): an httpx client
cost several times its CPU per request, all of it competing with the engine it measures.

The same client, given the gateway's URL, is the `openai` mode (its Chat Completions door) and,
given `door=RESPONSES`, the `responses` mode (its Responses door): one connection handling and
one clock for every HTTP door, only the body and the event reader differ (firsttoken/bench/sse.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from firsttoken.bench.sse import CHAT, Door
from firsttoken.bench.stats import RequestResult


def streaming_session(limit: int, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    """A pooled aiohttp session for streamed responses (call on the running loop): keep-alive
    connections up to `limit`, no body decompression, no cookies."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("Accept-Encoding",),
    )


class DirectClient:
    """Streams answers from ``base_url`` (e.g. http://127.0.0.1:8100/v1) through ``door``: Chat
    Completions (the default) or the gateway's Responses API."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "sim",
        api_key: str = "EMPTY",
        max_tokens: int | None = None,
        connections: int = 256,
        timeout_s: float = 120.0,
        extra: dict[str, Any] | None = None,
        door: Door = CHAT,
    ) -> None:
        self.extra = extra or {}  # more request fields (the gateway's `x_firsttoken`)
        self.door = door
        self.url = base_url.rstrip("/") + door.path
        self.model, self.max_tokens = model, max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30.0)
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = streaming_session(self._connections, self._timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, prompt: str) -> RequestResult:
        body = {**self.door.body(self.model, prompt, self.max_tokens), **self.extra}
        read = self.door.read
        t0 = time.perf_counter()
        result = RequestResult(start_s=t0)
        last = t0
        assert self._session is not None, "open() the client first"
        try:
            data = json.dumps(body).encode()
            async with self._session.post(self.url, data=data, headers=self._headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    result.error = f"http_{resp.status}"
                    return result
                buf = b""
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    buf += chunk
                    if b"\n\n" not in buf:
                        continue
                    events, _, buf = buf.rpartition(b"\n\n")
                    n = read(events, result)  # text deltas; the final event's usage, timings
                    if n > 0:
                        if result.ttft_ms is None:
                            result.ttft_ms = (now - t0) * 1000
                        else:
                            result.gaps_ms.append((now - last) * 1000)
                        last = now
                        result.chars += n
                result.total_ms = (time.perf_counter() - t0) * 1000
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.error = f"client_{type(exc).__name__}"
        return result
