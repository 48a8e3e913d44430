"""The embedder interface: texts in, L2-normalised float32 rows out."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from shared.errors import FirstTokenError

Vectors = npt.NDArray[np.float32]


class EmbeddingError(FirstTokenError):
    """The embedding backend failed; the cache treats it as a miss, never as a chat error."""


class Embedder(Protocol):
    """Loaded once per process. ``embed`` is synchronous and CPU- or network-bound: callers on an
    event loop run it in their executor."""

    name: str  # model id stored with each vector: vectors of different models never mix
    dim: int

    def embed(self, texts: list[str]) -> Vectors:
        """One unit-length row per text."""
        ...

    def read_chars(self, text: str) -> int:
        """How many leading characters of ``text`` its row depends on (``len(text)`` unless the
        model truncates): two texts that differ past that point get the same row."""
        ...

    def close(self) -> None: ...


def l2_normalize(rows: npt.NDArray[np.floating]) -> Vectors:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (rows / norms).astype(np.float32, copy=False)
    return out
