"""From an operator's risk to a similarity threshold. Pure, no I/O.

An operator sets ``FIRSTTOKEN_CACHE_MAX_ERROR_RATE``: the most traps (questions whose cached
neighbour has a different answer) the semantic tier may serve. A threshold is chosen from a
calibration: for each candidate threshold, how many traps of a labelled set were served. A
point estimate of 0 wrong out of a few hundred traps says little, so the choice uses the
one-sided 95% Clopper-Pearson upper bound of the wrong-serve rate: the threshold chosen is the
lowest whose bound is within the operator's risk. The tables come from
``firsttoken cache calibrate --write`` (workers/cache/calibrated.json), per embedding model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Point:
    """One threshold of a calibration: traps served of traps, paraphrases served of paraphrases."""

    threshold: float
    wrong: int
    traps: int
    served: int
    paraphrases: int

    @property
    def error_bound(self) -> float:
        return upper_bound(self.wrong, self.traps)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n is a few thousand at most)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        total += math.exp(log_term + i * lp + (n - i) * lq)
    return min(total, 1.0)


def upper_bound(wrong: int, n: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen as ``wrong`` out of ``n``."""
    if n <= 0:
        return 1.0
    if wrong >= n:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = wrong / n, 1.0
    for _ in range(60):  # bisection to well below any rate an operator would set
        mid = (lo + hi) / 2
        if _binom_cdf(wrong, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def choose(points: Sequence[Point], max_error_rate: float) -> Point | None:
    """The lowest-threshold point whose error bound is within ``max_error_rate``, provided every
    stricter threshold is within it too (a bound that dips then rises again is noise); None when
    no threshold meets it."""
    chosen = None
    for point in sorted(points, key=lambda p: p.threshold, reverse=True):
        if point.error_bound > max_error_rate:
            break
        chosen = point
    return chosen


# Used when an embedding model has no calibration table, or none of its thresholds meets the
# risk: only near-identical wordings are served.
STRICTEST = 0.97


def threshold_for(
    tables: Mapping[str, Sequence[Point]], embedder: str, max_error_rate: float
) -> float:
    point = choose(tables.get(embedder, ()), max_error_rate)
    return STRICTEST if point is None else point.threshold
