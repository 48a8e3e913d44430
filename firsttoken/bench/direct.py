"""The `direct` mode: the same load straight to the engine's OpenAI-compatible streaming API.

This is the floor: what a client would see with no gateway at all. The SSE stream is parsed
by hand from raw bytes (one split per event, JSON only for content events) because the load
generator has to stay far cheaper than the thing it measures.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from firsttoken.bench.loadgen import _loads
from firsttoken.bench.stats import RequestResult


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
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key}"},
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            timeout=httpx.Timeout(timeout_s, connect=30.0),
        )

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        await self._client.aclose()

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
            async with self._client.stream("POST", self.url, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    result.error = f"http_{resp.status_code}"
                    return result
                buf = b""
                async for chunk in resp.aiter_raw():
                    now = time.perf_counter()
                    buf += chunk
                    *events, buf = buf.split(b"\n\n")
                    for event in events:
                        if not event.startswith(b"data: ") or event == b"data: [DONE]":
                            continue
                        data = _loads(event[6:])
                        if data.get("usage"):
                            result.tokens = int(data["usage"].get("completion_tokens", 0))
                        for choice in data.get("choices") or ():
                            text = (choice.get("delta") or {}).get("content") or ""
                            if not text:
                                continue
                            if result.ttft_ms is None:
                                result.ttft_ms = (now - t0) * 1000
                            else:
                                result.gaps_ms.append((now - last) * 1000)
                            last = now
                            result.chars += len(text)
                result.total_ms = (time.perf_counter() - t0) * 1000
        except httpx.HTTPError as exc:
            result.error = f"client_{type(exc).__name__}"
        return result
