"""Measuring a verification judge on labelled answer pairs (workers/cache/judgecal.py; pure),
and the answer pairs themselves (tests/data/answers/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cache.judgecal import (
    auc,
    cut_rates,
    fit_cut,
    leave_one_out,
    load_answer_folds,
    verdict_rates,
)


def test_the_answer_pairs_are_four_balanced_folds_in_two_languages() -> None:
    folds = load_answer_folds()
    assert sorted(folds) == ["en_1", "en_2", "zh_1", "zh_2"]
    for name, pairs in folds.items():
        same = sum(p.same for p in pairs)
        assert same * 2 == len(pairs), name
        assert all(p.category.startswith(name[:3]) for p in pairs), name
        assert all(p.question and p.cached and p.fresh for p in pairs), name
    assert sum(len(p) for p in folds.values()) == 380


def test_verdict_rates_count_each_error_and_undecided_apart() -> None:
    rates = verdict_rates([True, False, None, True, False], [True, True, True, False, False])
    assert (rates.agreeing, rates.disagreeing, rates.undecided) == (2, 2, 1)
    assert (rates.false_disagree, rates.false_agree) == (1, 1)
    assert rates.false_disagree_rate == 0.5 and rates.false_agree_rate == 0.5
    both = rates + rates
    assert (both.agreeing, both.false_agree, both.undecided) == (4, 2, 2)


def test_the_fitted_cut_is_the_lowest_within_the_false_agreements_allowed() -> None:
    scores = [0.95, 0.9, 0.8, 0.7, 0.85, 0.6, 0.55, 0.5]
    labels = [True, True, True, True, False, False, False, False]
    # One disagreeing pair of four may pass (25%): a cut at 0.6 lets 0.6 and 0.85 through;
    # at 0.7 only 0.85.
    assert fit_cut(scores, labels, 0.25) == 0.7
    assert cut_rates(scores, labels, 0.7).false_agree == 1
    assert cut_rates(scores, labels, 0.7).false_disagree == 0
    assert fit_cut(scores, labels, 0.0) == 0.9
    # Any scale: a cross-encoder's logits.
    assert fit_cut([3.2, -1.0, 0.4, -2.5], [True, False, True, False], 0.0) == 0.4
    # No cut keeps an agreeing pair above every disagreeing one: none.
    assert fit_cut([0.6, 0.9], [True, False], 0.0) is None


def test_each_fold_is_checked_with_the_cut_fitted_on_the_others() -> None:
    scores = {"a": [0.9, 0.6], "b": [0.8, 0.7], "c": [0.95, 0.75]}
    labels = {"a": [True, False], "b": [True, False], "c": [True, False]}
    results = {r.fold: r for r in leave_one_out(scores, labels, 0.0)}
    # Fitted on b and c: 0.8 (the lowest agreeing score above 0.75); on a and c: 0.9; on a
    # and b: 0.8.
    assert (results["a"].cut, results["b"].cut, results["c"].cut) == (0.8, 0.9, 0.8)
    assert results["a"].rates.false_agree == 0 and results["a"].rates.false_disagree == 0
    assert results["b"].rates.false_disagree == 1  # 0.8 falls under the cut fitted elsewhere
    assert results["c"].rates.false_agree == 0


def test_auc_is_the_share_of_agreeing_pairs_scored_above_disagreeing_ones() -> None:
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.5, 0.5], [True, False]) == 0.5


def test_a_malformed_file_names_its_line(tmp_path: Path) -> None:
    good = {"q": "q", "a": "a", "b": "b", "same": True, "category": "en_reworded"}
    (tmp_path / "answers_x.jsonl").write_text(json.dumps(good) + "\n{}\n")
    with pytest.raises(ValueError, match=r"answers_x.jsonl:2"):
        load_answer_folds(tmp_path)
    (tmp_path / "answers_x.jsonl").write_text(json.dumps({**good, "same": "false"}) + "\n")
    with pytest.raises(ValueError, match=r"answers_x.jsonl:1: .*not true or false"):
        load_answer_folds(tmp_path)
    with pytest.raises(ValueError, match="no answers_"):
        load_answer_folds(tmp_path / "missing")
