"""Replay of a labelled stream through the online verification rule (workers/cache/online.py).
Pure: no sockets, no model; ``firsttoken cache replay`` feeds it the eval sets' pairs.

Each lookup draws a labelled pair: its score (what the threshold is compared with; None when
the guards refuse it at any threshold) and whether the cached answer is right for it. The
"engine's answer" equals the cached one exactly when the pair is labelled same-answer; the
judge reports that, wrong ``judge_error`` of the time. The true wrong-serve rate at a threshold
is read off the population the stream draws from, so it can be set beside the estimate.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from workers.cache.online import (
    Estimate,
    Rule,
    bucket_of,
    near_miss,
    should_verify,
    threshold_in_force,
)


@dataclass(frozen=True, slots=True)
class Item:
    score: float | None
    same_answer: bool


@dataclass(frozen=True, slots=True)
class Checkpoint:
    lookups: int
    verified: int  # verdicts recorded so far (sampled hits and near misses)
    estimate: Estimate  # at the threshold in force
    true_rate: float  # the population's wrong-serve rate at that threshold
    served_share: float  # of same-answer lookups so far, the share served


@dataclass
class ReplayResult:
    lookups: int = 0
    served: int = 0
    served_wrong: int = 0
    same_lookups: int = 0
    same_served: int = 0
    verified: int = 0
    checkpoints: list[Checkpoint] = field(default_factory=list)


def true_rate(items: Sequence[Item], threshold: float) -> float:
    served = [it for it in items if it.score is not None and it.score >= threshold - 1e-9]
    return sum(1 for it in served if not it.same_answer) / len(served) if served else 0.0


def replay(
    items: Sequence[Item],
    rule: Rule,
    *,
    lookups: int,
    verify_rate: float,
    band: float = 0.05,
    judge_error: float = 0.0,
    refresh_every: int = 50,
    checkpoint_every: int = 500,
    seed: int = 45,
) -> ReplayResult:
    """Draw ``lookups`` pairs in random order and serve, verify and move the threshold as a
    tenant's workers would (the threshold refreshed every ``refresh_every`` lookups)."""
    rng = random.Random(seed)
    verdicts: dict[int, tuple[int, int]] = {}
    out = ReplayResult()
    current = threshold_in_force(verdicts, rule)
    for i in range(1, lookups + 1):
        item = items[rng.randrange(len(items))]
        out.lookups += 1
        out.same_lookups += item.same_answer
        served = item.score is not None and item.score >= current.threshold - 1e-9
        check = False
        if served:
            out.served += 1
            out.served_wrong += not item.same_answer
            out.same_served += item.same_answer
            check = should_verify(verify_rate, rng.random())
        elif item.score is not None:
            check = near_miss(item.score, current.threshold, band)
        if check:
            assert item.score is not None
            agree = item.same_answer != (rng.random() < judge_error)
            b = bucket_of(item.score)
            n, d = verdicts.get(b, (0, 0))
            verdicts[b] = (n + 1, d + (not agree))
            out.verified += 1
        if i % refresh_every == 0:
            current = threshold_in_force(verdicts, rule)
        if i % checkpoint_every == 0:
            out.checkpoints.append(
                Checkpoint(
                    i,
                    out.verified,
                    current,
                    true_rate(items, current.threshold),
                    out.same_served / out.same_lookups if out.same_lookups else 0.0,
                )
            )
    return out
