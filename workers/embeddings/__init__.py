"""Sentence embeddings behind one interface: local ONNX MiniLM (default) or an
OpenAI-compatible `/v1/embeddings` server. See :mod:`workers.embeddings.base`."""

from workers.embeddings.base import Embedder, EmbeddingError
from workers.embeddings.factory import make_embedder

__all__ = ["Embedder", "EmbeddingError", "make_embedder"]
