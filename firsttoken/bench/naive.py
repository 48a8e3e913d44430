"""The `naive` mode: the classic synchronous pattern the source article starts from.

One blocking thread per request: a non-streaming completion request, then a synchronous
database write (sqlite3, commit per row) and a log line, and only then is the answer shown.
So the user's "first token" is the whole answer: ``ttft_ms == total_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from firsttoken.bench.stats import RequestResult

_SCHEMA = """CREATE TABLE IF NOT EXISTS chat_log (
    id INTEGER PRIMARY KEY, created_at REAL, prompt TEXT, answer TEXT, tokens INTEGER)"""


class NaiveClient:
    """Sends each request from its own worker thread, as a threaded WSGI app would."""

    def __init__(
        self,
        base_url: str,
        db_path: Path,
        log_path: Path,
        *,
        threads: int,
        model: str = "sim",
        api_key: str = "EMPTY",
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.db_path, self.model, self.max_tokens = db_path, model, max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = timeout_s
        self._local = threading.local()
        self._opened: list[tuple[httpx.Client, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="naive")
        self.log = logging.getLogger(f"firsttoken.bench.naive.{id(self)}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        self._handler = logging.FileHandler(log_path)
        self.log.addHandler(self._handler)
        with sqlite3.connect(db_path) as db:
            db.execute(_SCHEMA)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        for http, db in self._opened:
            http.close()
            db.close()
        self._opened.clear()
        self.log.removeHandler(self._handler)
        self._handler.close()

    def _thread_state(self) -> tuple[httpx.Client, sqlite3.Connection]:
        if not hasattr(self._local, "http"):
            self._local.http = httpx.Client(headers=self._headers, timeout=self._timeout)
            self._local.db = sqlite3.connect(self.db_path, timeout=30, check_same_thread=False)
            with self._lock:
                self._opened.append((self._local.http, self._local.db))
        return self._local.http, self._local.db

    def _blocking(self, prompt: str) -> RequestResult:
        http, db = self._thread_state()
        t0 = time.perf_counter()
        result = RequestResult(start_s=t0)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
        }
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        try:
            resp = http.post(self.url, json=body)
            resp.raise_for_status()
            data = resp.json()
            answer = data["choices"][0]["message"]["content"]
            tokens = int(data.get("usage", {}).get("completion_tokens", 0))
            db.execute(
                "INSERT INTO chat_log (created_at, prompt, answer, tokens) VALUES (?, ?, ?, ?)",
                (time.time(), prompt, answer, tokens),
            )
            db.commit()
            self.log.info("chat done tokens=%d chars=%d", tokens, len(answer))
        except (httpx.HTTPError, sqlite3.Error, KeyError, ValueError) as exc:
            result.error = f"client_{type(exc).__name__}"
            return result
        # Shown only now, all at once: first token and full answer arrive together.
        result.total_ms = result.ttft_ms = (time.perf_counter() - t0) * 1000
        result.tokens, result.chars = tokens, len(answer)
        return result

    async def send(self, prompt: str) -> RequestResult:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._blocking, prompt)
