"""`firsttoken cache judge-eval` as an operator runs it: the embedding judge over the labelled
answer pairs with the worker's own embedder, and the LLM judge through the configured engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def _judge_eval(*args: str, **settings: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env.update({f"FIRSTTOKEN_{k.upper()}": v for k, v in settings.items()})
    done = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "judge-eval", "--json", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_embedding_judge_is_fitted_on_three_folds_and_checked_on_the_fourth() -> None:
    out = _judge_eval("--judge", "embedding", "--max-false-agree", "0.05")
    folds = {row["fold"]: row for row in out["folds"]}
    assert sorted(folds) == ["en_1", "en_2", "zh_1", "zh_2"]
    for row in folds.values():
        assert row["cut"] is not None and 0.5 <= row["cut"] < 1.0
        assert 0.5 < row["auc"] < 1.0
        assert row["agreeing"] == row["disagreeing"] and row["undecided"] == 0
    pooled = out["pooled"]
    assert (pooled["agreeing"], pooled["disagreeing"]) == (190, 190)
    # What the docs and the setting's help say of it: a cut that keeps false agreements
    # near 5% calls most agreeing answers wrong.
    assert pooled["false_agree_rate"] <= 0.1
    assert pooled["false_disagree_rate"] > 0.5


def test_the_llm_judge_asks_the_engine_and_counts_what_is_neither_yes_nor_no() -> None:
    """The simulator answers lorem ipsum: every pair is asked, none decided."""
    out = _judge_eval("--judge", "llm", engine="sim")
    pooled = out["pooled"]
    assert pooled["undecided"] == 380
    assert pooled["agreeing"] == pooled["disagreeing"] == 0
    assert all(row["cut"] is None for row in out["folds"])


def test_an_unknown_setting_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "judge-eval", "--setting", "engine=sim"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no cache setting 'engine'" in done.stderr and "Traceback" not in done.stderr
