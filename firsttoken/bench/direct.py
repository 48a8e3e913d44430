"""The `direct` mode: the same load straight to the engine's OpenAI-compatible streaming API.

This is the floor: what a client would see with no gateway at all. The SSE stream is read
as raw bytes and its content deltas counted, not parsed (JSON only for the final usage event),
because the load generator has to stay far cheaper than the thing it measures. ``chars``
counts content deltas here, not characters.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import httpx

from firsttoken.bench.loadgen import _loads
from firsttoken.bench.stats import RequestResult

# Compact JSON (vLLM, the simulator) and json.dumps' default spacing (LiteLLM).
_CONTENT = (b'"content":"', b'"content": "')
_EMPTY = (b'"content":""', b'"content": ""')
_USAGE = b'"usage":{'


class DirectClient:
    """Streams chat completions from ``base_url`` (e.g. http://127.0.0.1:8100/v1)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "sim",
        api_key: str = "EMPTY",
        max_tokens: int | None = None,
        connections: int = 256,
        timeout_s: float = 120.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_tokens = model, max_tokens
        # Several small pools rather than one big one: httpcore's pool does work per waiting
        # request on every change, which costs the load generator CPU at hundreds of streams.
        n = max(1, min(connections, 32))
        per = -(-connections // n)
        self._clients = [
            httpx.AsyncClient(
                headers={"Authorization": f"Bearer {api_key}"},
                limits=httpx.Limits(max_connections=per, max_keepalive_connections=per),
                timeout=httpx.Timeout(timeout_s, connect=30.0),
            )
            for _ in range(n)
        ]
        self._next = itertools.count()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def send(self, prompt: str) -> RequestResult:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "messages": [{"role": "user", "content": prompt}],
            "stream_options": {"include_usage": True},
        }
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        t0 = time.perf_counter()
        result = RequestResult(start_s=t0)
        last = t0
        try:
            client = self._clients[next(self._next) % len(self._clients)]
            async with client.stream("POST", self.url, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    result.error = f"http_{resp.status_code}"
                    return result
                buf = b""
                async for chunk in resp.aiter_raw():
                    now = time.perf_counter()
                    buf += chunk
                    if b"\n\n" not in buf:
                        continue
                    events, _, buf = buf.rpartition(b"\n\n")
                    # Byte counting, not JSON: an empty content delta (the role chunk) is
                    # `"content":""`; every other content delta is one token. Only the rare
                    # usage event is parsed.
                    n = sum(events.count(c) for c in _CONTENT) - sum(
                        events.count(e) for e in _EMPTY
                    )
                    if n > 0:
                        if result.ttft_ms is None:
                            result.ttft_ms = (now - t0) * 1000
                        else:
                            result.gaps_ms.append((now - last) * 1000)
                        last = now
                        result.chars += n
                    if _USAGE in events:
                        for event in events.split(b"\n\n"):
                            if _USAGE in event and event.startswith(b"data: {"):
                                usage = _loads(event[6:]).get("usage") or {}
                                result.tokens = int(usage.get("completion_tokens", 0))
                result.total_ms = (time.perf_counter() - t0) * 1000
        except httpx.HTTPError as exc:
            result.error = f"client_{type(exc).__name__}"
        return result
