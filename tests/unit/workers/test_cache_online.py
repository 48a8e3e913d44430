"""Online verification of the semantic cache (workers/cache/online.py, replay.py; pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cache.online import (
    JudgeErrors,
    Rule,
    bucket_of,
    estimate,
    near_miss,
    parse_score,
    parse_yes_no,
    threshold_in_force,
    wilson_upper,
)
from workers.cache.replay import Item, replay, true_rate

SCORES = Path(__file__).parent / "data" / "cache_replay_scores.json"


def test_wilson_upper_bound_of_known_counts() -> None:
    assert wilson_upper(0, 0) == 1.0
    assert wilson_upper(0, 300) == pytest.approx(0.0089, abs=5e-4)
    assert wilson_upper(5, 100) == pytest.approx(0.0984, abs=2e-3)


def test_verdicts_are_counted_by_score_bucket_and_estimated_above_a_threshold() -> None:
    assert bucket_of(0.734) == 73 and bucket_of(1.2) == 100 and bucket_of(0.7) == 70
    verdicts = {90: (100, 0), 80: (100, 10)}
    assert estimate(verdicts, 0.85).verified == 100 and estimate(verdicts, 0.85).rate == 0
    assert estimate(verdicts, 0.8).rate == pytest.approx(0.05)


def test_a_judge_that_errs_at_known_rates_is_corrected() -> None:
    errors = JudgeErrors(0.05, 0.05)
    assert errors.correct(0.05) == 0.0 and errors.correct(0.5) == pytest.approx(0.5)


def test_without_enough_verdicts_the_shipped_threshold_stays() -> None:
    rule = Rule(max_error_rate=0.01, base=0.9, min_verified=100)
    assert threshold_in_force({}, rule).threshold == 0.9
    assert threshold_in_force({95: (50, 0)}, rule).threshold == 0.9


def test_clean_evidence_lowers_the_threshold_and_bad_evidence_raises_it() -> None:
    rule = Rule(max_error_rate=0.01, base=0.9, min_verified=100)
    clean = {b: (60, 0) for b in range(80, 101)}
    # down to where verdicts lie within 0.05 above it (the near-miss band then reaches lower)
    assert threshold_in_force(clean, rule).threshold == 0.76
    bad = {**clean, 85: (60, 15)}  # 15 wrong at 0.85: from 0.85 down over 1%
    lowered = threshold_in_force(bad, rule)
    assert lowered.threshold == 0.86 and lowered.upper <= 0.01
    worse = {100: (50, 0), 95: (300, 30)}  # 10% wrong at and above the shipped threshold
    assert threshold_in_force(worse, rule).threshold == 1.0


def test_near_misses_and_judges_replies() -> None:
    assert near_miss(0.86, 0.9, 0.05) and not near_miss(0.84, 0.9, 0.05)
    assert not near_miss(0.9, 0.9, 0.05)
    assert parse_yes_no("Yes.") is True and parse_yes_no("no") is False
    assert parse_yes_no("maybe") is None
    assert parse_score({"data": [{"score": 0.7}]}) == 0.7
    assert parse_score({"results": [{"index": 0, "relevance_score": 0.2}]}) == 0.2
    assert parse_score([{"index": 0, "score": 0.9}]) == 0.9
    assert parse_score({"error": "x"}) is None


def _items() -> list[Item]:
    """validation + holdout pairs (`firsttoken cache replay --scores ...` wrote the file):
    each pair's highest threshold that serves it, or None."""
    return [Item(s, same) for s, same in json.loads(SCORES.read_text())]


@pytest.mark.parametrize("base", [0.97, 0.73])
@pytest.mark.parametrize("judge_error", [0.0, 0.05])
def test_replayed_labelled_stream_keeps_the_true_rate_under_the_bound(
    base: float, judge_error: float
) -> None:
    """The eval pairs as traffic in random order: after 500 verified lookups the true
    wrong-serve rate at the threshold in force is under the estimate's 95% bound, at every
    checkpoint, with a perfect judge and with one that errs 5% of the time (uncorrected:
    its false disagreements only push the estimate up)."""
    items = _items()
    rule = Rule(max_error_rate=0.01, base=base, min_verified=100)
    lookups = 100_000 if base > 0.9 else 60_000  # few near misses and hits above 0.97
    result = replay(items, rule, lookups=lookups, verify_rate=0.05, judge_error=judge_error)
    after = [c for c in result.checkpoints if c.verified >= 500]
    assert after, "too few verdicts: raise lookups"
    covered = [c.true_rate <= c.estimate.upper for c in after]
    # A 95% bound: over many checkpoints a few may miss (4 distinct traps are served at 0.73,
    # so the sampled disagreements come in lumps); at 0.97 none may.
    assert sum(covered) >= (len(after) if base > 0.9 else 0.9 * len(after)), after
    if judge_error == 0.0:
        # the estimate tracks the truth: within its own bound's width
        last = after[-1]
        assert abs(last.estimate.rate - last.true_rate) <= last.estimate.upper - last.estimate.rate
    assert result.same_served > 0


def test_true_rate_reads_the_population() -> None:
    items = [Item(0.9, True), Item(0.95, False), Item(None, False), Item(0.5, False)]
    assert true_rate(items, 0.9) == 0.5 and true_rate(items, 0.99) == 0.0
