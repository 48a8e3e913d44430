"""Any OpenAI-compatible `/v1/embeddings` server (vLLM `--task embed`, TEI, OpenAI itself).

Synchronous on purpose: the cache runs ``embed`` in an executor thread, and one pooled
``httpx.Client`` per process keeps the connection warm.
"""

from __future__ import annotations

import httpx
import numpy as np

from workers.embeddings.base import EmbeddingError, Vectors, l2_normalize


class OpenAIEmbedder:
    def __init__(
        self, base_url: str, model: str, *, api_key: str = "EMPTY", timeout_s: float = 2.0
    ) -> None:
        self.name = f"openai:{model}"
        self._model = model
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )
        self.dim = 0  # learnt from the first answer

    def embed(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, max(self.dim, 1)), dtype=np.float32)
        try:
            resp = self._client.post("/embeddings", json={"model": self._model, "input": texts})
            resp.raise_for_status()
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            rows = np.array([d["embedding"] for d in data], dtype=np.float32)
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            raise EmbeddingError(f"embeddings server failed: {exc}") from exc
        if rows.shape[0] != len(texts):
            raise EmbeddingError(
                f"embeddings server returned {rows.shape[0]} rows for {len(texts)}"
            )
        self.dim = int(rows.shape[1])
        return l2_normalize(rows)

    def read_chars(self, text: str) -> int:
        return len(text)  # a server that cannot read a text whole refuses it

    def close(self) -> None:
        self._client.close()
