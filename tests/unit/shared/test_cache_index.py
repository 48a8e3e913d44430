"""In-memory vector indexes: exact numpy and usearch HNSW."""

from __future__ import annotations

import numpy as np

from workers.cache.index import AnnIndex, CacheIndex, ExactIndex


def _unit(rng: np.random.Generator, n: int, dim: int = 32) -> np.ndarray:
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_exact_index_finds_nearest_and_forgets_removed() -> None:
    """Search returns the best key first; a removed key is never returned again."""
    rng = np.random.default_rng(1)
    rows = _unit(rng, 100)
    index = ExactIndex(32)
    for i, row in enumerate(rows):
        index.add(i + 1000, row)
    assert index.search(rows[7], 3, 0.5)[0][0] == 1007
    index.remove(1007)
    assert 1007 not in index and len(index) == 99
    assert all(key != 1007 for key, _ in index.search(rows[7], 5, -1.0))
    assert index.search(rows[99], 1, 0.99)[0][0] == 1099  # the row moved into the hole


def test_ann_index_agrees_with_exact_on_top_hit() -> None:
    """usearch's nearest neighbour matches brute force on a small set."""
    rng = np.random.default_rng(2)
    rows = _unit(rng, 500)
    ann = AnnIndex(32)
    ann.add_many(np.arange(500, dtype=np.int64), rows)
    for i in (0, 123, 499):
        assert ann.search(rows[i], 1, 0.9)[0][0] == i
    ann.remove(123)
    assert 123 not in ann


def test_cache_index_isolates_partitions_promotes_and_skips_expired() -> None:
    """Tenants never see each other's rows; big partitions move to ANN; expired rows are skipped."""
    rng = np.random.default_rng(3)
    rows = _unit(rng, 40)
    index = CacheIndex(32, ann_min_entries=30)
    for i, row in enumerate(rows):
        index.add("t1", "p", i, row, expires_at=100.0 if i else 5.0)
    assert index.search("t2", "p", rows[3], k=1, min_score=0.5, now=10.0) == []
    assert index.search("t1", "p", rows[3], k=1, min_score=0.5, now=10.0)[0][0] == 3
    assert index.search("t1", "p", rows[0], k=1, min_score=0.99, now=10.0) == []
    assert type(index._parts[("t1", "p")].index).__name__ == "AnnIndex"


def test_search_breadth_grows_with_the_index_and_can_be_fixed() -> None:
    from workers.cache.index import EXPANSION_LARGEST, AnnIndex, expansion_for

    assert expansion_for(1) == 64 and expansion_for(199_999) == 64
    assert expansion_for(200_000) == 128 and expansion_for(1_000_000) == EXPANSION_LARGEST
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((50, 16)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    ann = AnnIndex(16)
    ann.add_many(np.arange(1, 51, dtype=np.int64), rows)
    assert ann.search(rows[3], 1, 0.0)[0][0] == 4 and ann.expansion_search == 64
    ann.expansion_search = 200
    assert ann.search(rows[3], 1, 0.0)[0][0] == 4 and ann.expansion_search == 200
