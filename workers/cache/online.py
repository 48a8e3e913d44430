"""Online verification of the semantic tier: verdicts in, the threshold in force out. Pure.

The shipped thresholds (workers/cache/folds.py) hold on the project's folds; the traffic a
tenant sends is another distribution. So a share of semantic hits is answered by the engine as
well, off the user's path, and a judge says whether the engine's answer and the cached one
agree; lookups that fall just under the threshold (a *near miss*) are compared after the
engine answers them anyway. Each verdict is counted in the bucket of the lookup's score (the
score the threshold is compared with, 0.01 wide), per tenant.

The wrong-serve rate at threshold ``t`` is estimated from the verdicts of lookups scoring at
least ``t``: disagreements / verified. Hits are verified at one rate and near misses all, so
below the threshold in force the lower-scoring (riskier) lookups weigh more than they would
in traffic: the estimate there errs towards too high, the safe side. The bound is the one-sided
95% Wilson upper bound (closed form, cheap enough for every refresh), corrected for a judge
that errs at known rates. The threshold in force is the lowest whose bound is within the
operator's ``max_error_rate`` with at least ``min_verified`` verdicts, no stricter one showing
a rate over it; without that much evidence, the shipped threshold stays, and with evidence
against it (a measured rate over the risk at or above it), the ceiling (near repeats only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

Z95 = 1.6448536269514722  # one-sided 95%
BUCKETS = 100  # per unit of score: 0.01 wide
# Verdicts as stored: bucket -> (verified, disagreed).
Verdicts = Mapping[int, tuple[int, int]]


def bucket_of(score: float) -> int:
    """The bucket of a score; a verified near repeat's score (>= 1.0) is the top bucket."""
    return max(0, min(BUCKETS, math.floor(score * BUCKETS + 1e-9)))


def wilson_upper(disagreed: int, verified: int, z: float = Z95) -> float:
    if verified <= 0:
        return 1.0
    p = disagreed / verified
    denom = 1 + z * z / verified
    centre = p + z * z / (2 * verified)
    spread = z * math.sqrt(p * (1 - p) / verified + z * z / (4 * verified * verified))
    return min(1.0, (centre + spread) / denom)


@dataclass(frozen=True, slots=True)
class JudgeErrors:
    """How often the judge says *disagree* to answers that agree (``false_disagree``) and
    *agree* to answers that do not (``false_agree``); 0, 0 trusts it."""

    false_disagree: float = 0.0
    false_agree: float = 0.0

    def correct(self, rate: float) -> float:
        """The true rate behind an observed disagreement rate."""
        scale = 1.0 - self.false_disagree - self.false_agree
        if scale <= 0:
            return 1.0
        return min(1.0, max(0.0, (rate - self.false_disagree) / scale))


@dataclass(frozen=True, slots=True)
class Estimate:
    threshold: float
    verified: int
    disagreed: int
    rate: float  # corrected point estimate (0 when nothing was verified)
    upper: float  # corrected 95% upper bound (1 when nothing was verified)


def estimate(verdicts: Verdicts, threshold: float, errors: JudgeErrors = JudgeErrors()) -> Estimate:
    """The wrong-serve rate of the lookups scoring at least ``threshold``."""
    low = bucket_of(threshold)
    n = sum(v for b, (v, _) in verdicts.items() if b >= low)
    d = sum(x for b, (_, x) in verdicts.items() if b >= low)
    rate = errors.correct(d / n) if n else 0.0
    return Estimate(threshold, n, d, rate, errors.correct(wilson_upper(d, n)))


@dataclass(frozen=True, slots=True)
class Rule:
    max_error_rate: float
    base: float  # the shipped threshold (folds), kept while evidence is short
    min_verified: int = 100
    floor: float = 0.55  # the loosest threshold the evidence may move to
    ceiling: float = 1.0  # where evidence against every threshold sends it
    # A threshold is only moved to where lookups scoring just above it were verified: this
    # many verdicts within ``local_width`` above it (else the estimate is that of the lookups
    # far above, and says nothing of the new ones it would serve).
    local_min: int = 20
    local_width: float = 0.05
    errors: JudgeErrors = JudgeErrors()


def threshold_in_force(verdicts: Verdicts, rule: Rule) -> Estimate:
    """The threshold the tenant's verdicts allow, with its estimate."""
    chosen: Estimate | None = None
    against = False
    for b in range(bucket_of(rule.ceiling), bucket_of(rule.floor) - 1, -1):
        est = estimate(verdicts, b / BUCKETS, rule.errors)
        if est.verified < rule.min_verified:
            continue
        local = sum(
            v for k, (v, _) in verdicts.items() if b <= k < b + round(rule.local_width * BUCKETS)
        )
        if est.upper <= rule.max_error_rate:
            if local >= rule.local_min:
                chosen = est
        elif est.rate > rule.max_error_rate:
            # Evidence against this threshold: a looser one that looks fine again past it
            # is noise.
            against = b / BUCKETS >= rule.base - 1e-9
            break
        # else: too few verdicts to tell; look further down
    if chosen is not None:
        return chosen
    return estimate(verdicts, rule.ceiling if against else rule.base, rule.errors)


def should_verify(rate: float, draw: float) -> bool:
    """Whether a semantic hit is verified, for a uniform ``draw`` in [0, 1)."""
    return draw < rate


def near_miss(score: float, threshold: float, band: float) -> bool:
    """A lookup whose best candidate scored just under the threshold: compared with the
    engine's answer once it comes (no engine cost)."""
    return threshold - band <= score < threshold


def agrees(similarity: float, cut: float) -> bool:
    """The embedding judge: two answers agree when their embeddings are this similar."""
    return similarity >= cut


def parse_yes_no(text: str) -> bool | None:
    """An LLM judge's reply: True for yes, False for no, None when it says neither first."""
    words = text.strip().lower().lstrip("*\"' ").split()
    first = words[0].strip(".,!:;*\"'") if words else ""
    if first in ("yes", "是", "是的"):
        return True
    if first in ("no", "否", "不是"):
        return False
    return None


def parse_score(body: object) -> float | None:
    """The score of a scoring server's reply: vLLM /score (``{"data": [{"score"}]}``), vLLM
    /rerank (``{"results": [{"relevance_score"}]}``) or TEI /rerank (``[{"score"}]``)."""
    try:
        if isinstance(body, list):
            return float(body[0]["score"])
        if isinstance(body, dict):
            if "data" in body:
                return float(body["data"][0]["score"])
            if "results" in body:
                row = body["results"][0]
                return float(row.get("relevance_score", row.get("score")))
    except (LookupError, TypeError, ValueError):
        return None
    return None
