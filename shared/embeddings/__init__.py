"""Sentence embeddings behind one interface: local ONNX MiniLM (default) or an
OpenAI-compatible `/v1/embeddings` server. See :mod:`shared.embeddings.base`."""

from shared.embeddings.base import Embedder, EmbeddingError
from shared.embeddings.factory import make_embedder

__all__ = ["Embedder", "EmbeddingError", "make_embedder"]
