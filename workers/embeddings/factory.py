"""Build the configured embedder (once per process; the caller keeps it).

Local models (embed_backend=onnx), by ``embed_local_model``:

- ``per-language`` (default): text with CJK characters is embedded by USE multilingual v3,
  other text by all-MiniLM-L6-v2 int8 (``workers.embeddings.per_language``). On the cache's
  evaluation sets, MiniLM ranks a Chinese question's paraphrase first among that set's Chinese
  questions for 29-35 % of them, USE for 92-99 %; unrelated Chinese questions score up to 0.99
  with MiniLM (99th percentile 0.91-0.99), 0.47-0.57 with USE. On English text MiniLM is as
  good or better (unrelated questions further apart), so it keeps English.
- ``minilm``: MiniLM for all text (the vectors of earlier versions).
- ``use-multilingual``: USE for all text (one space for every language: a question also
  finds its translation).
"""

from __future__ import annotations

from shared.errors import ConfigError
from shared.settings import Settings
from workers.embeddings.base import Embedder


def make_embedder(settings: Settings) -> Embedder:
    if settings.embed_backend == "openai":
        if not settings.embed_url:
            raise ConfigError("FIRSTTOKEN_EMBED_BACKEND=openai needs FIRSTTOKEN_EMBED_URL")
        from workers.embeddings.openai_embed import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.embed_url, settings.embed_model, api_key=settings.embed_api_key
        )
    if settings.embed_local_model == "use-multilingual":
        return _use(settings)
    minilm = _minilm(settings)
    if settings.embed_local_model == "minilm":
        return minilm
    from workers.embeddings.per_language import PerLanguage

    try:
        use = _use(settings)
    except BaseException:
        minilm.close()
        raise
    return PerLanguage(minilm, use, cjk_scale=settings.embed_cjk_scale)


def _minilm(settings: Settings) -> Embedder:
    from pathlib import Path

    from workers.embeddings.onnx_minilm import OnnxMiniLM
    from workers.embeddings.quantize import default_cache_dir

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


def _use(settings: Settings) -> Embedder:
    from workers.embeddings.use_multilingual import UseMultilingual

    return UseMultilingual(threads=settings.embed_threads)
