"""In-memory vector indexes of one worker process: exact numpy cosine for small partitions,
usearch HNSW for large ones. No I/O; the store keeps them in sync with Redis.

Why two: a brute-force matrix product over a few thousand unit vectors is cheap, exact, and
supports cheap removal, but its cost grows with every row, where HNSW's barely does. usearch was
chosen over hnswlib by measurement (docs/benchmarks.md, "Semantic cache"): similar recall and
query time, but it builds faster, removes entries for real (hnswlib only marks them), and stores
int8 rows (a quarter of float32's memory per entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


class VectorIndex(Protocol):
    def add(self, key: int, vector: Vector) -> None: ...
    def remove(self, key: int) -> None: ...
    def search(self, query: Vector, k: int, min_score: float) -> list[tuple[int, float]]: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: int) -> bool: ...
    def items(self) -> list[tuple[int, Vector]]: ...
    def memory_bytes(self) -> int: ...


class ExactIndex:
    """Unit vectors in one growing float32 matrix; removal swaps the last row in."""

    def __init__(self, dim: int, capacity: int = 64) -> None:
        self.dim = dim
        self._rows = np.zeros((capacity, dim), dtype=np.float32)
        self._keys = np.zeros(capacity, dtype=np.int64)
        self._pos: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, key: int) -> bool:
        return key in self._pos

    def add(self, key: int, vector: Vector) -> None:
        if key in self._pos:
            self._rows[self._pos[key]] = vector
            return
        n = len(self._pos)
        if n == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
            self._keys = np.concatenate([self._keys, np.zeros_like(self._keys)])
        self._rows[n] = vector
        self._keys[n] = key
        self._pos[key] = n

    def remove(self, key: int) -> None:
        row = self._pos.pop(key, None)
        if row is None:
            return
        last = len(self._pos)
        if row != last:
            self._rows[row] = self._rows[last]
            moved = int(self._keys[last])
            self._keys[row] = moved
            self._pos[moved] = row

    def search(self, query: Vector, k: int, min_score: float) -> list[tuple[int, float]]:
        n = len(self._pos)
        if n == 0:
            return []
        scores = self._rows[:n] @ query
        k = min(k, n)
        top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.argsort(-scores[top])]
        return [(int(self._keys[i]), float(scores[i])) for i in top if scores[i] >= min_score]

    def items(self) -> list[tuple[int, Vector]]:
        n = len(self._pos)
        return [(int(self._keys[i]), self._rows[i].copy()) for i in range(n)]

    def memory_bytes(self) -> int:
        # The dict costs roughly 100 bytes an entry on CPython 3.11.
        return int(self._rows.nbytes + self._keys.nbytes + 100 * len(self._pos))


# HNSW's search breadth by index size (384-d, i8, M=16): a small breadth keeps its recall on
# small indexes and loses it on large ones, and a larger breadth costs search time on every
# lookup (docs/benchmarks.md, "Semantic cache"). A missed neighbour is a cache miss, never a
# wrong answer, so the breadth grows only where recall drops.
EXPANSION_STEPS = ((200_000, 64), (500_000, 128))
EXPANSION_LARGEST = 256


def expansion_for(size: int) -> int:
    """The HNSW search breadth (usearch expansion_search) for an index of `size` entries."""
    for below, ef in EXPANSION_STEPS:
        if size < below:
            return ef
    return EXPANSION_LARGEST


class AnnIndex:
    """usearch HNSW over inner product of unit vectors, int8 rows."""

    def __init__(self, dim: int, *, dtype: str = "i8", connectivity: int = 16) -> None:
        # onnxruntime (the embedder) must be loaded before usearch: imported after it, in
        # the same process, onnxruntime 1.32 crashes on load (SIGSEGV, with usearch 2.26 /
        # numkong 7.8). A worker usually loads its embedder first; this makes it always so.
        import onnxruntime  # noqa: F401
        from usearch.index import Index

        self.dim = dim
        self._index = Index(
            ndim=dim,
            metric="ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=128,
            expansion_search=64,
        )
        self._ef = 64
        self._fixed_ef: int | None = None
        # Index rows are quantised; keep nothing else per entry.

    def __len__(self) -> int:
        return len(self._index)

    @property
    def expansion_search(self) -> int:
        """Candidates HNSW keeps while searching: higher finds the true nearest more often
        (recall) at more time per search. By index size (`expansion_for`) unless set."""
        return self._ef

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        self._fixed_ef = value
        self._apply_ef(value)

    def _apply_ef(self, ef: int) -> None:
        self._index.expansion_search = ef  # type: ignore[misc]  # settable at runtime
        self._ef = ef

    def __contains__(self, key: int) -> bool:
        return bool(self._index.contains(key))

    def add(self, key: int, vector: Vector) -> None:
        if self._index.contains(key):
            self._index.remove(key)
        self._index.add(key, vector)

    def add_many(self, keys: npt.NDArray[np.int64], vectors: Vector) -> None:
        self._index.add(keys, vectors)

    def remove(self, key: int) -> None:
        if self._index.contains(key):
            self._index.remove(key)

    def search(self, query: Vector, k: int, min_score: float) -> list[tuple[int, float]]:
        size = len(self._index)
        if size == 0:
            return []
        ef = self._fixed_ef or expansion_for(size)
        if ef != self._ef:
            self._apply_ef(ef)
        matches = self._index.search(query, k)
        out = []
        for key, distance in zip(matches.keys, matches.distances, strict=True):
            score = 1.0 - float(distance)  # usearch's "ip" distance is 1 - dot
            if score >= min_score:
                out.append((int(key), score))
        return out

    def items(self) -> list[tuple[int, Vector]]:
        keys = np.asarray(self._index.keys, dtype=np.int64)
        vectors = np.asarray(self._index.get(keys), dtype=np.float32)
        return [(int(k), v) for k, v in zip(keys, vectors, strict=True)]

    def memory_bytes(self) -> int:
        return int(self._index.memory_usage)


@dataclass
class Partition:
    """One tenant's questions under one model route and system prompt."""

    dim: int
    ann_min_entries: int
    index: VectorIndex = field(init=False)

    def __post_init__(self) -> None:
        self.index = ExactIndex(self.dim)

    def add(self, key: int, vector: Vector) -> None:
        self.index.add(key, vector)
        if isinstance(self.index, ExactIndex) and len(self.index) >= self.ann_min_entries:
            self._promote()

    def _promote(self) -> None:
        ann = AnnIndex(self.dim)
        items = self.index.items()
        keys = np.array([k for k, _ in items], dtype=np.int64)
        ann.add_many(keys, np.stack([v for _, v in items]))
        self.index = ann


class CacheIndex:
    """Every partition this process knows, and which partition each entry key lives in."""

    def __init__(self, dim: int, ann_min_entries: int) -> None:
        self.dim = dim
        self.ann_min_entries = ann_min_entries
        self._parts: dict[tuple[str, str], Partition] = {}
        self._where: dict[int, tuple[str, str]] = {}
        self._expires: dict[int, float] = {}
        # Exact-tier pointers: the hit path then needs one Redis round trip, not two.
        self._exact: dict[tuple[str, str], int] = {}
        self._exact_of: dict[int, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def add(
        self,
        tenant: str,
        part: str,
        key: int,
        vector: Vector,
        expires_at: float,
        exact: str = "",
    ) -> None:
        if exact:
            self._exact[(tenant, exact)] = key
            self._exact_of[key] = (tenant, exact)
        where = (tenant, part)
        if self._where.get(key, where) != where:
            self.remove(key)
        partition = self._parts.get(where)
        if partition is None:
            partition = self._parts[where] = Partition(self.dim, self.ann_min_entries)
        partition.add(key, vector)
        self._where[key] = where
        self._expires[key] = expires_at

    def remove(self, key: int) -> None:
        where = self._where.pop(key, None)
        self._expires.pop(key, None)
        pointer = self._exact_of.pop(key, None)
        if pointer is not None and self._exact.get(pointer) == key:
            del self._exact[pointer]
        if where is not None and where in self._parts:
            self._parts[where].index.remove(key)

    def search(
        self, tenant: str, part: str, query: Vector, *, k: int, min_score: float, now: float
    ) -> list[tuple[int, float]]:
        """Up to k live entries of the partition scoring at least ``min_score``, best first."""
        partition = self._parts.get((tenant, part))
        if partition is None:
            return []
        found = partition.index.search(query, k, min_score)
        return [(key, s) for key, s in found if self._expires.get(key, 0.0) > now]

    def exact(self, tenant: str, exact: str, now: float) -> int | None:
        """The live entry stored for this exact request hash, if this process knows it."""
        key = self._exact.get((tenant, exact))
        if key is None or self._expires.get(key, 0.0) <= now:
            return None
        return key

    def size(self, tenant: str, part: str) -> int:
        partition = self._parts.get((tenant, part))
        return 0 if partition is None else len(partition.index)

    def memory_bytes(self) -> int:
        # Four dicts of bookkeeping at roughly 100 bytes an entry each.
        return sum(p.index.memory_bytes() for p in self._parts.values()) + 400 * len(self._where)
