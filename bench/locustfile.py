"""A Locust user for firsttoken's websocket protocol, for teams that already use Locust.

    pip install locust            # not a firsttoken dependency
    FIRSTTOKEN_URL=ws://127.0.0.1:8000/v1/ws FIRSTTOKEN_API_KEY=ft-... \
        locust -f bench/locustfile.py --headless -u 50 -r 10 -t 60s

Each user holds one websocket and asks one question at a time. Every chat reports two entries
to Locust: ``ttft`` (time to the first token frame) and ``answer`` (time to the `done` frame),
and errors under the protocol's error code. `firsttoken bench` measures the same with lower
client overhead (one asyncio process instead of gevent greenlets), the direct and naive
baselines, and percentiles over repeats; use this file to fold firsttoken into existing Locust
suites.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from typing import Any

from locust import User, between, task  # type: ignore[import-not-found]
from websockets.sync.client import ClientConnection, connect

URL = os.environ.get("FIRSTTOKEN_URL", "ws://127.0.0.1:8000/v1/ws")
API_KEY = os.environ.get("FIRSTTOKEN_API_KEY", os.environ.get("FIRSTTOKEN_DEV_API_KEY", ""))
MAX_TOKENS = int(os.environ.get("FIRSTTOKEN_BENCH_MAX_TOKENS", "128"))
CACHE = os.environ.get("FIRSTTOKEN_BENCH_CACHE", "0") == "1"
TOPICS = ("reset my password", "export my data", "cancel my plan", "rotate an API key")
_ids = itertools.count()


class FirstTokenUser(User):  # type: ignore[misc]
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        self.ws: ClientConnection = connect(
            URL, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None
        )

    def on_stop(self) -> None:
        self.ws.close()

    def _report(self, name: str, ms: float, length: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="WS",
            name=name,
            response_time=ms,
            response_length=length,
            exception=exc,
            context={},
        )

    @task
    def chat(self) -> None:
        chat_id = f"l{next(_ids)}"
        question = f"How do I {random.choice(TOPICS)} (case {random.randrange(10**9)})?"
        frame: dict[str, Any] = {
            "type": "chat",
            "id": chat_id,
            "max_tokens": MAX_TOKENS,
            "cache": CACHE,
            "messages": [{"role": "user", "content": question}],
        }
        t0 = time.perf_counter()
        first: float | None = None
        chars = 0
        self.ws.send(json.dumps(frame))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") != chat_id:
                continue
            if msg["type"] == "token":
                if first is None:
                    first = time.perf_counter()
                    self._report("ttft", (first - t0) * 1000, 0, None)
                chars += len(msg["text"])
            elif msg["type"] == "done":
                self._report("answer", (time.perf_counter() - t0) * 1000, chars, None)
                return
            elif msg["type"] == "error":
                self._report(
                    "answer",
                    (time.perf_counter() - t0) * 1000,
                    0,
                    RuntimeError(f"{msg['code']}: {msg['message']}"),
                )
                return
