"""One embedder made of two: CJK text to one model, all other text to another.

Each text is embedded by one model only, into that model's own block of the vector; the other
block stays zero. Two texts of the same side then score exactly what their model scores; a
Chinese and an English text score 0 (never one hit), whatever the models would say.

The CJK block may be *calibrated*: with ``cjk_scale`` a in (0, 1], a CJK row is
``[0, sqrt(a) * v, sqrt(1 - a)]`` (the last coordinate is a constant one only CJK rows share),
so two CJK texts whose model scores ``s`` score ``a * s + 1 - a``: their cosine distance is
multiplied by a. The order of the scores is kept (retrieval ranks the same); what changes is
where the cache's one similarity threshold falls on that model's scale. A model whose
paraphrases score 0.8 is thus compared with thresholds chosen for MiniLM, whose paraphrases
score 0.9 and more (the scale is measured, see ``workers.embeddings.factory``).
"""

from __future__ import annotations

import math

import numpy as np

from workers.cache.normalize import has_cjk
from workers.embeddings.base import Embedder, EmbeddingError, Vectors


class PerLanguage:
    def __init__(self, other: Embedder, cjk: Embedder, cjk_scale: float = 1.0) -> None:
        if not 0 < cjk_scale <= 1:
            raise EmbeddingError(f"cjk_scale must be in (0, 1], not {cjk_scale}")
        self.other = other
        self.cjk = cjk
        self.cjk_scale = cjk_scale
        scale = "" if cjk_scale == 1 else f"@{cjk_scale:g}"
        # The name is stored with every vector: a change of either model or of the scale
        # makes a new vector space that never mixes with the old one.
        self.name = f"{other.name}+cjk:{cjk.name}{scale}"
        self.dim = other.dim + cjk.dim + 1
        # `firsttoken cache prepare` reports the file it built (the other model's int8 build).
        self.model_path = getattr(other, "model_path", None)
        self._a = math.sqrt(cjk_scale)
        self._b = math.sqrt(1.0 - cjk_scale)

    def embed(self, texts: list[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        cjk = [i for i, t in enumerate(texts) if has_cjk(t)]
        other = [i for i, t in enumerate(texts) if not has_cjk(t)]
        d = self.other.dim
        if other:
            out[other, :d] = self.other.embed([texts[i] for i in other])
        if cjk:
            out[cjk, d : d + self.cjk.dim] = self._a * self.cjk.embed([texts[i] for i in cjk])
            out[cjk, -1] = self._b
        return out

    def read_chars(self, text: str) -> int:
        return (self.cjk if has_cjk(text) else self.other).read_chars(text)

    def close(self) -> None:
        try:
            self.other.close()
        finally:
            self.cjk.close()
