"""Leave-one-fold-out calibration (workers/cache/folds.py, pure) and the thresholds it ships."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from workers.cache.calibrated import FOLDS, RISKS
from workers.cache.calibration import STRICTEST, Point
from workers.cache.folds import at, cross_fit, fold_of, pooled, ship, shipped_threshold
from workers.cache.stage import policy_from

DEFAULT_TABLE = "all-MiniLM-L6-v2-int8+cjk:use-multilingual-v3+overlap"


def test_a_pair_falls_in_its_set_and_language_and_related_files_make_their_own_fold() -> None:
    assert fold_of("dev", "questions.jsonl", "zh_negation", "x") == "dev-zh"
    assert fold_of("holdout", "conversations.jsonl", "conv_en_topic_change", "x") == "holdout-en"
    assert fold_of("validation", "related_zh.jsonl", "zh_related_question", "x") == "related-zh"
    assert fold_of("holdout", "related_en.jsonl", "en_related_question", "x") == "related-en"
    assert fold_of("dev", "conversations.jsonl", "conv_same", "我的订单到哪了") == "dev-zh"
    assert fold_of("dev", "conversations.jsonl", "conv_same", "Where is it?") == "dev-en"


def _fold(wrong_by_t: dict[float, int], traps: int) -> list[Point]:
    return [Point(t, w, traps, 0, 10) for t, w in sorted(wrong_by_t.items())]


def test_pooled_adds_counts_threshold_by_threshold_and_at_reads_the_next_row_up() -> None:
    a, b = _fold({0.8: 2, 0.9: 0}, 100), _fold({0.8: 1, 0.9: 1}, 50)
    assert pooled([a, b]) == [Point(0.8, 3, 150, 0, 20), Point(0.9, 1, 150, 0, 20)]
    assert at(a, 0.85).threshold == 0.9 and at(a, 0.95).threshold == 0.9


def test_a_fold_that_the_others_misjudge_makes_the_shipped_threshold_stricter() -> None:
    """Four clean folds would choose 0.7; the fifth serves 3% of its traps there and is clean
    only from 0.9: the threshold shipped for 1% is one that holds on it too."""
    ts = [0.7, 0.8, 0.9, 0.97]
    clean = {t: 0 for t in ts}
    folds = {f"f{i}": _fold(clean, 300) for i in range(4)}
    folds["odd"] = _fold({0.7: 9, 0.8: 4, 0.9: 0, 0.97: 0}, 300)
    naive = cross_fit(folds, 0.01, 1.0)
    assert [c.threshold for c in naive.checks if c.fold == "odd"] == [0.7]
    assert not naive.holds  # 9 of 300 held out at 0.7
    fit = ship(folds, 0.01)
    assert fit.holds and fit.threshold >= 0.9
    assert all(c.shipped.wrong / c.shipped.traps <= 0.01 for c in fit.checks)


def test_a_risk_no_rule_can_hold_ships_the_strictest_threshold() -> None:
    folds = {f"f{i}": _fold({0.8: 5, 0.97: 1}, 20) for i in range(3)}
    fit = ship(folds, 0.01)
    assert not fit.holds and fit.threshold == STRICTEST


def test_an_operator_risk_gets_the_threshold_of_the_largest_shipped_level_within_it() -> None:
    risks = {"m": ((0.005, 0.9), (0.01, 0.85), (0.02, 0.7))}
    assert shipped_threshold(risks, "m", 0.01) == 0.85
    assert shipped_threshold(risks, "m", 0.015) == 0.85  # between levels: the stricter
    assert shipped_threshold(risks, "m", 0.001) is None
    assert shipped_threshold(risks, "other", 0.01) is None


def test_the_default_embedder_ships_fold_checked_thresholds() -> None:
    """The worker's default threshold is the one shipped by the leave-one-fold-out run, and it
    is no looser as the risk falls."""
    assert DEFAULT_TABLE in RISKS and DEFAULT_TABLE in FOLDS
    levels = RISKS[DEFAULT_TABLE]
    assert [t for _, t in levels] == sorted((t for _, t in levels), reverse=True)
    name = DEFAULT_TABLE.removesuffix("+overlap")
    policy = policy_from(Settings(), name)
    assert policy.verifier == "overlap"
    assert policy.threshold == shipped_threshold(RISKS, DEFAULT_TABLE, 0.01)


@pytest.mark.parametrize("risk", [0.005, 0.01, 0.02, 0.05])
def test_at_the_shipped_threshold_every_fold_serves_at_most_the_risk_of_its_traps(
    risk: float,
) -> None:
    """The promise, fold by fold, on the stored tables (`firsttoken cache calibrate --folds`)."""
    threshold = shipped_threshold(RISKS, DEFAULT_TABLE, risk)
    assert threshold is not None
    for fold, table in FOLDS[DEFAULT_TABLE].items():
        row = at(table, threshold)
        assert row.wrong <= risk * row.traps, (fold, row)


def test_shipped_thresholds_never_loosen_as_the_risk_falls_nor_fall_back_as_it_rises() -> None:
    from workers.cache.folds import ship_all

    ts = [0.7, 0.8, 0.9, 1.0]
    folds = {f"f{i}": _fold({0.7: 30, 0.8: 1, 0.9: 0, 1.0: 0}, 300) for i in range(5)}
    thresholds = [fit.threshold for fit in ship_all(folds, (0.001, 0.01, 0.5))]
    assert thresholds == sorted(thresholds, reverse=True)
    assert thresholds[-1] <= thresholds[1] < 1.0 and ts
