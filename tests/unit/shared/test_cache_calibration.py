"""From the operator's risk to a threshold (workers/cache/calibration.py, pure)."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from workers.cache.calibrated import CALIBRATION
from workers.cache.calibration import STRICTEST, Point, choose, threshold_for, upper_bound
from workers.cache.verify import table_key
from workers.embeddings.factory import make_embedder


def test_upper_bound_matches_known_clopper_pearson_values() -> None:
    """0 of 300 is the rule of three (about 1%); 5 of 100 is about 10.2%; all wrong is 1."""
    assert upper_bound(0, 300) == pytest.approx(1 - 0.05 ** (1 / 300), rel=1e-6)
    assert upper_bound(5, 100) == pytest.approx(0.1023, abs=5e-4)
    assert upper_bound(3, 3) == 1.0 and upper_bound(0, 0) == 1.0


def _points(*rows: tuple[float, int]) -> list[Point]:
    return [Point(t, wrong, 500, 0, 100) for t, wrong in rows]


def test_choose_takes_the_lowest_threshold_within_the_risk() -> None:
    """Lower thresholds serve more; the chosen one is the lowest whose bound is within risk."""
    points = _points((0.95, 0), (0.9, 0), (0.85, 2), (0.8, 9))
    assert choose(points, 0.01).threshold == 0.9  # type: ignore[union-attr]
    assert choose(points, 0.015).threshold == 0.85  # type: ignore[union-attr]
    assert choose(points, 0.001) is None


def test_choose_stops_at_the_first_threshold_over_the_risk() -> None:
    """A bound that dips again below the risk at a looser threshold is noise, not chosen."""
    points = _points((0.95, 0), (0.9, 6), (0.85, 0))
    assert choose(points, 0.01).threshold == 0.95  # type: ignore[union-attr]


def test_an_uncalibrated_model_or_an_unmet_risk_gets_the_strictest_threshold() -> None:
    tables = {"m": tuple(_points((0.9, 0)))}
    assert threshold_for(tables, "other", 0.05) == STRICTEST
    assert threshold_for(tables, "m", 0.0001) == STRICTEST
    assert threshold_for(tables, "m", 0.05) == 0.9


@pytest.mark.parametrize("local_model", ["per-language", "minilm"])
def test_the_shipped_embedders_are_calibrated_and_the_default_risk_is_met(local_model: str) -> None:
    """The default embedder (per language) and MiniLM alone have a table each, and the
    default risk (1%) picks one of its thresholds."""
    embedder = make_embedder(Settings(embed_local_model=local_model))  # type: ignore[arg-type]
    try:
        assert embedder.name in CALIBRATION, "run firsttoken cache calibrate --write"
        assert threshold_for(CALIBRATION, embedder.name, 0.01) < STRICTEST
        verified = table_key(embedder.name, "overlap")
        assert verified in CALIBRATION, "firsttoken cache calibrate --write"
        assert choose(CALIBRATION[verified], 0.01) is not None
    finally:
        embedder.close()
