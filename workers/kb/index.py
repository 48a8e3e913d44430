"""Per-tenant vector indexes of the knowledge base in one worker process.

Reuses the cache's exact numpy cosine index: KB sizes per tenant are thousands of chunks, where
a matrix product is exact and well under a millisecond. Each tenant's index remembers the
version it was loaded at (chunk count and highest chunk id) and is reloaded when the database
says it changed, so `kb add` / `kb remove` reach running workers without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workers.cache.index import ExactIndex, Vector


@dataclass
class TenantIndex:
    version: tuple[int, int]
    index: ExactIndex
    texts: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hit:
    chunk_id: int
    score: float
    text: str


class KbIndexes:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._tenants: dict[str, TenantIndex] = {}

    def version(self, tenant_id: str) -> tuple[int, int] | None:
        held = self._tenants.get(tenant_id)
        return held.version if held else None

    def load(
        self, tenant_id: str, version: tuple[int, int], rows: list[tuple[int, str, bytes]]
    ) -> None:
        """Replace the tenant's index with ``rows`` (chunk id, text, float32 bytes)."""
        index = ExactIndex(self.dim, capacity=max(64, len(rows)))
        texts: dict[int, str] = {}
        for chunk_id, text, blob in rows:
            vector = np.frombuffer(blob, dtype=np.float32)
            if vector.shape != (self.dim,):
                continue  # written by another embedding model: it cannot be compared
            index.add(chunk_id, vector)
            texts[chunk_id] = text
        self._tenants[tenant_id] = TenantIndex(version, index, texts)

    def search(self, tenant_id: str, query: Vector, k: int, min_score: float) -> list[Hit]:
        held = self._tenants.get(tenant_id)
        if held is None:
            return []
        return [
            Hit(key, score, held.texts[key])
            for key, score in held.index.search(query, k, min_score)
        ]
