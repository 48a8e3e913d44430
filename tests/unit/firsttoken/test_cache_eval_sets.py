"""The cache's evaluation sets (dev, validation, holdout) and `firsttoken cache eval` over them.

The sets' contents are checked here (counts, categories, no pair shared between sets, the frozen
holdout's hashes); the rates the cache reaches on them are measured with the CLI, not asserted.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from firsttoken.cacheargs import setting_env
from shared.protocol import Message
from tests.support import child_env
from workers.cache.evaluate import (
    Pair,
    PairSet,
    data_dir,
    kind,
    load_file,
    load_set,
    set_files,
    set_report,
)

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
VALIDATION = DATA / "validation"
HOLDOUT = VALIDATION / "holdout"
FILES = (
    "questions_en.jsonl",
    "questions_zh.jsonl",
    "conversations.jsonl",
    "related_en.jsonl",
    "related_zh.jsonl",
)
TRUE_KINDS = ("paraphrase_reworded", "near_repeat")
TRAP_KINDS = (
    "negation",
    "antonym",
    "entity_swap",
    "number_change",
    "date_change",
    "scope_change",
    "unit_change",
    "comparison_swap",
    "role_swap",
    "constraint_change",
)
CONV_TRAP_KINDS = ("detail_change", "intent_flip", "topic_change", "no_history")


def _both(name: str) -> list[Pair]:
    """A file's pairs, validation and holdout together (the file as written)."""
    return load_file(VALIDATION / name) + load_file(HOLDOUT / name)


def _text(messages: list[Message]) -> str:
    joined = "\n".join(f"{m.role}:{m.content}" for m in messages)
    return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", joined).casefold())


def _keys(pairs: list[Pair]) -> set[tuple[str, str]]:
    """Each pair as its two normalised texts, in either order."""
    out: set[tuple[str, str]] = set()
    for p in pairs:
        a, b = sorted((_text(p.a), _text(p.b)))
        out.add((a, b))
    return out


def _set_pairs(name: str) -> list[Pair]:
    return [p for path in set_files(DATA, name) for p in load_file(path)]


def test_every_file_parses_and_ends_with_a_user_message() -> None:
    for folder in (VALIDATION, HOLDOUT):
        assert sorted(p.name for p in folder.glob("*.jsonl")) == sorted(FILES)
        for name in FILES:
            for p in load_file(folder / name):
                for messages in (p.a, p.b):
                    assert messages and messages[-1].role == "user", (name, p)
                    assert all(m.content.strip() for m in messages), (name, p)


def test_questions_en_counts_and_categories() -> None:
    pairs = _both("questions_en.jsonl")
    counts = Counter(p.category for p in pairs)
    assert len(pairs) >= 300
    assert counts["en_paraphrase_reworded"] >= 100
    assert counts["en_near_repeat"] >= 40
    assert sum(counts[f"en_{k}"] for k in TRAP_KINDS) >= 160
    assert all(counts[f"en_{k}"] >= 10 for k in TRAP_KINDS), counts
    assert set(counts) == {f"en_{k}" for k in TRUE_KINDS + TRAP_KINDS}


def test_questions_zh_counts_and_categories() -> None:
    pairs = _both("questions_zh.jsonl")
    counts = Counter(p.category for p in pairs)
    assert len(pairs) >= 200
    assert set(counts) == {f"zh_{k}" for k in TRUE_KINDS + TRAP_KINDS}
    assert all(counts[f"zh_{k}"] >= 10 for k in TRAP_KINDS), counts
    cjk = re.compile(r"[\u4e00-\u9fff]")
    assert all(cjk.search(p.b[-1].content) for p in pairs)


@pytest.mark.parametrize(
    ("name", "lang", "least"), [("related_en.jsonl", "en", 200), ("related_zh.jsonl", "zh", 150)]
)
def test_related_questions_are_all_traps_of_one_category(name: str, lang: str, least: int) -> None:
    """Same topic, different question: every pair a trap, no question in two pairs."""
    pairs = _both(name)
    assert len(pairs) >= least
    assert {p.category for p in pairs} == {f"{lang}_related_question"}
    questions = [_text(m) for p in pairs for m in (p.a, p.b)]
    assert len(set(questions)) == len(questions)


def test_conversations_counts_and_categories() -> None:
    pairs = _both("conversations.jsonl")
    counts = Counter(p.category for p in pairs)
    assert len(pairs) >= 150
    expected = {f"conv_{lang}_{k}" for lang in ("en", "zh") for k in CONV_TRAP_KINDS}
    expected |= {"conv_en_equivalent", "conv_zh_equivalent"}
    assert set(counts) == expected
    for p in pairs:
        if p.category.endswith("no_history"):
            assert sorted((len(p.a), len(p.b)))[0] == 1, p
        else:
            assert 2 <= len(p.a) <= 5 and 2 <= len(p.b) <= 5, p


def test_same_answer_follows_the_category() -> None:
    for name in FILES:
        for p in _both(name):
            assert p.same_answer == kind(p.category).endswith((*TRUE_KINDS, "equivalent")), (
                p.category
            )


def test_no_pair_is_in_two_sets() -> None:
    dev, validation, holdout = (_keys(_set_pairs(n)) for n in ("dev", "validation", "holdout"))
    assert not dev & validation
    assert not dev & holdout
    assert not validation & holdout
    assert len(validation) == len(_set_pairs("validation")), "a pair repeats in validation"
    assert len(holdout) == len(_set_pairs("holdout")), "a pair repeats in holdout"


def test_holdout_is_a_stratified_third() -> None:
    for name in FILES:
        held = Counter(p.category for p in load_file(HOLDOUT / name))
        kept = Counter(p.category for p in load_file(VALIDATION / name))
        assert set(held) == set(kept), name
        for category, n in held.items():
            assert n == round((n + kept[category]) / 3), (name, category)


def test_holdout_hashes_match_the_readme() -> None:
    readme = (VALIDATION / "README.md").read_text(encoding="utf-8")
    recorded = dict(re.findall(r"`holdout/([\w.]+\.jsonl)` \| `([0-9a-f]{64})`", readme))
    assert sorted(recorded) == sorted(FILES)
    for name, digest in recorded.items():
        actual = hashlib.sha256((HOLDOUT / name).read_bytes()).hexdigest()
        assert actual == digest, f"holdout/{name} changed after it was frozen"


def test_kind_drops_the_language() -> None:
    assert kind("en_negation") == kind("zh_negation") == "negation"
    assert kind("conv_zh_detail_change") == "conv_detail_change"
    assert kind("conv_same_context_paraphrase") == "conv_same_context_paraphrase"
    assert kind("") == "-"


def test_the_checkout_sets_are_found_beside_the_package() -> None:
    assert data_dir() == DATA
    assert [p.name for p in set_files(DATA, "holdout")] == sorted(FILES)
    with pytest.raises(ValueError, match="unknown set"):
        set_files(DATA, "test")


def test_set_report_has_rates_per_set_file_kind_and_category(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text(
        '{"a": "q1", "b": "q1?", "same_answer": true, "category": "en_near_repeat"}\n'
        '{"a": "q2", "b": "q3", "same_answer": false, "category": "zh_negation"}\n'
        '{"a": "q4", "b": "q5", "same_answer": false, "category": "en_negation"}\n',
        encoding="utf-8",
    )
    pair_set: PairSet = load_set(tmp_path, "dev")
    out = set_report(pair_set, [True, True, False])
    assert out["pairs"] == 3
    assert (out["served_rate"], out["wrong_serve_rate"]) == (1.0, 0.5)
    assert out["by_kind"]["negation"] == {"served_rate": None, "wrong_serve_rate": 0.5, "pairs": 2}
    assert out["by_category"]["zh_negation"]["wrong_serve_rate"] == 1.0
    assert out["by_file"]["x.jsonl"]["pairs"] == 3


def test_setting_names_a_cache_environment_variable() -> None:
    fields = {"cache_threshold", "cache_context_threshold", "embed_backend"}
    assert setting_env("threshold=0.9", fields) == ("FIRSTTOKEN_CACHE_THRESHOLD", "0.9")
    assert setting_env("FIRSTTOKEN_CACHE_CONTEXT_THRESHOLD= 0.8", fields) == (
        "FIRSTTOKEN_CACHE_CONTEXT_THRESHOLD",
        "0.8",
    )
    with pytest.raises(ValueError, match="no cache setting 'thresold'"):
        setting_env("thresold=0.9", fields)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        setting_env("threshold", fields)


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "eval", *args],
        cwd=ROOT,
        env={**child_env(), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _tiny_sets(root: Path) -> Path:
    conv = [
        {"role": "user", "content": "I ordered a lamp, order 111."},
        {"role": "assistant", "content": "Order 111 shipped."},
        {"role": "user", "content": "When will it arrive?"},
    ]
    rows = {
        root / "dev.jsonl": [
            {"a": "How do I bake bread?", "b": "how do i bake bread", "same_answer": True},
        ],
        root / "validation" / "v.jsonl": [
            {"a": "Is it open?", "b": "Is it closed?", "same_answer": False, "category": "en_x"},
            {"a": conv, "b": conv[-1:], "same_answer": False, "category": "conv_en_no_history"},
        ],
        root / "validation" / "holdout" / "h.jsonl": [
            {"a": "Hi", "b": "Hi", "same_answer": True, "category": "zh_near_repeat"},
        ],
    }
    for path, lines in rows.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return root


def test_cli_reports_every_set_side_by_side(tmp_path: Path) -> None:
    data = _tiny_sets(tmp_path)
    proc = _eval("--data-dir", str(data), "--sets", "dev,validation,holdout", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out["sets"]) == ["dev", "validation", "holdout"]
    assert out["mode"] == "guarded" and isinstance(out["threshold"], float)
    for row in out["sets"].values():
        assert {
            "pairs",
            "served_rate",
            "wrong_serve_rate",
            "by_category",
            "by_kind",
            "by_file",
        } <= (set(row))
    assert out["sets"]["validation"]["pairs"] == 2
    assert out["sets"]["validation"]["served_rate"] is None
    assert out["sets"]["holdout"]["served_rate"] == 1.0  # an exact repeat is always served
    assert "validation: 2 pairs" in proc.stderr  # progress goes to stderr, not into the JSON

    text = _eval("--data-dir", str(data), "--sets", "dev,holdout", "--setting", "threshold=0.5")
    assert text.returncode == 0, text.stderr
    assert "threshold 0.5" in text.stdout and "near_repeat" in text.stdout


def test_calibrate_prints_each_threshold_and_renders_a_readable_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cache calibrate` measures every threshold of its grid; --write renders a table the
    workers read (written here to a temporary file, not the checkout's)."""
    from firsttoken import cachecli
    from workers.cache import calibrated
    from workers.cache.calibration import Point

    data = _tiny_sets(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "calibrate", "--data-dir", str(data),
         "--sets", "validation", "--grid", "0.8:0.9:0.05"],
        cwd=ROOT, env={**child_env(), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:4]] == [
        "0.800",
        "0.850",
        "0.900",
    ]
    assert "0/2" in proc.stdout and "max error rate 0.01" in proc.stdout

    text = cachecli.render_calibrated({"m": [Point(0.9, 0, 2, 1, 1)]}, "validation")
    path = tmp_path / "calibrated.json"
    path.write_text(text)
    data = calibrated._load(path)
    assert calibrated._points(data["calibration"]["m"]) == (Point(0.9, 0, 2, 1, 1),)
    assert (data["sets"], data["folds"], data["risks"]) == ("validation", {}, {})


@pytest.mark.parametrize("grid", ["0.9:0.8:0.01", "a:b:c", "0.8:0.9:0"])
def test_calibrate_refuses_a_bad_grid(grid: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "calibrate", "--grid", grid],
        cwd=ROOT, env={**child_env(), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "--grid" in proc.stderr


def test_cli_one_file_keeps_the_single_set_shape(tmp_path: Path) -> None:
    data = _tiny_sets(tmp_path)
    proc = _eval(str(data / "validation" / "v.jsonl"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == {"served_rate", "wrong_serve_rate", "by_category"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sets", "dev,test"), "choose among dev,validation,holdout"),
        (("--setting", "thresold=0.9"), "no cache setting 'thresold'"),
        (("x.jsonl", "--sets", "dev"), "not both"),
    ],
)
def test_cli_rejects_bad_arguments_with_what_to_do(args: tuple[str, ...], message: str) -> None:
    proc = _eval(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_cli_without_the_sets_says_where_they_are(tmp_path: Path) -> None:
    proc = _eval("--data-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "has no *.jsonl files" in proc.stderr


def test_cli_outside_a_checkout_says_how_to_find_the_sets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from firsttoken.cli import main

    monkeypatch.setattr("workers.cache.evaluate.data_dir", lambda: None)
    assert main(["cache", "eval", "--json"]) == 2
    err = capsys.readouterr().err
    assert "no tests/ beside it" in err and "--data-dir" in err


def test_calibrate_folds_prints_each_fold_left_out_from_saved_fold_tables(tmp_path: Path) -> None:
    """`cache calibrate --folds --points FILE` reads saved fold tables (no model loaded) and
    prints, per risk, the threshold shipped and each fold at the threshold the others chose."""
    rows = [[0.8, 3, 100, 50, 60], [0.9, 0, 100, 40, 60], [1.0, 0, 100, 30, 60]]
    folds = {f"f{i}-en": rows for i in range(4)}
    points = tmp_path / "folds.json"
    points.write_text(json.dumps({"table": "m+overlap", "folds": folds}))
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "calibrate", "--folds", "--points",
         str(points), "--data-dir", str(_tiny_sets(tmp_path))],
        cwd=ROOT, env={**child_env(), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "max error rate 0.01: shipped threshold 0.9" in proc.stdout
    assert "f3-en" in proc.stdout and "0/100" in proc.stdout
