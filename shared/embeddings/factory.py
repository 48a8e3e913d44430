"""Build the configured embedder (once per process; the caller keeps it)."""

from __future__ import annotations

from shared.embeddings.base import Embedder
from shared.errors import ConfigError
from shared.settings import Settings


def make_embedder(settings: Settings) -> Embedder:
    if settings.embed_backend == "openai":
        if not settings.embed_url:
            raise ConfigError("FIRSTTOKEN_EMBED_BACKEND=openai needs FIRSTTOKEN_EMBED_URL")
        from shared.embeddings.openai_embed import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.embed_url, settings.embed_model, api_key=settings.embed_api_key
        )
    from pathlib import Path

    from shared.embeddings.onnx_minilm import OnnxMiniLM
    from shared.embeddings.quantize import default_cache_dir

    cache_dir = None
    if settings.embed_quantize == "int8":
        cache_dir = (
            Path(settings.embed_cache_dir) if settings.embed_cache_dir else default_cache_dir()
        )
    return OnnxMiniLM(
        settings.embed_model_path,
        settings.embed_tokenizer_path,
        threads=settings.embed_threads,
        int8_cache_dir=cache_dir,
    )
