"""Leave-one-fold-out calibration: a threshold chosen on some sets, checked on another. Pure.

A threshold calibrated on the sets it is then measured on keeps its promise there and nowhere
else: the default of issue 28 (1% -> 0.73, chosen on dev+validation) served 3.3% of an
independent set's traps. So the labelled pairs are cut into folds, by set and by language
(``dev-en``, ``dev-zh``, ``validation-en``, ``validation-zh``, ``related-en``, ``related-zh``,
``holdout-en``, ``holdout-zh``; the related-question files of validation and holdout make the
``related`` folds), and the calibration rule (workers/cache/calibration.py ``choose``: the lowest
threshold whose 95% upper bound of the wrong-serve rate is within a risk) is run on all folds
but one and checked on the one left out, for each fold in turn.

When the rule at the operator's risk ``R`` does not hold out of sample, it is run at a smaller
internal risk ``k * R`` (``SHRINKS``): the shipped threshold for ``R`` is that of the largest
``k`` with which every held-out fold served at most ``R`` of its traps and the held-out traps
of all folds together (each trap is held out exactly once) have a 95% upper bound within
``R``. The threshold shipped is then the strictest of: the rule at ``k * R`` on all folds, and
each fold's own held-out-checked threshold. A fold of 40-120 traps cannot show 1% with 95%
confidence on its own (0 of 60 has a bound of 4.9%); the pooled bound is the one that can.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from workers.cache.calibration import STRICTEST, Point, choose, upper_bound

# Internal risk as a share of the operator's, largest first: the first that holds out is used.
SHRINKS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1)
# The risks whose thresholds are shipped (workers/cache/calibrated.json, RISKS); an operator's
# risk between two of them gets the smaller one's threshold (the stricter).
RISK_LEVELS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1)


def _has_cjk(text: str) -> bool:
    return any("\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" for ch in text)


def fold_of(set_name: str, file_name: str, category: str, last_question: str) -> str:
    """The fold of one pair: its set (the related-question files make their own) and its
    language (from the category's prefix, else whether its question has CJK characters)."""
    group = "related" if file_name.startswith("related") else set_name
    if category.startswith(("zh_", "conv_zh_")):
        lang = "zh"
    elif category.startswith(("en_", "conv_en_")):
        lang = "en"
    else:
        lang = "zh" if _has_cjk(last_question) else "en"
    return f"{group}-{lang}"


def fold_points(
    thresholds: Sequence[float],
    hits: Sequence[Sequence[bool]],
    same_answer: Sequence[bool],
    folds: Sequence[str],
) -> dict[str, list[Point]]:
    """Per fold, a calibration table: traps and paraphrases served at each threshold.
    ``hits[i][j]``: pair j served at ``thresholds[i]``."""
    out: dict[str, list[Point]] = {}
    for name in sorted(set(folds)):
        idx = [j for j, f in enumerate(folds) if f == name]
        traps = sum(1 for j in idx if not same_answer[j])
        rows = []
        for threshold, row in zip(thresholds, hits, strict=True):
            wrong = sum(1 for j in idx if row[j] and not same_answer[j])
            ok = sum(1 for j in idx if row[j] and same_answer[j])
            rows.append(Point(round(threshold, 4), wrong, traps, ok, len(idx) - traps))
        out[name] = rows
    return out


def pooled(tables: Iterable[Sequence[Point]]) -> list[Point]:
    """The tables of several folds as one (counts added threshold by threshold)."""
    sums: dict[float, list[int]] = {}
    for table in tables:
        for p in table:
            row = sums.setdefault(p.threshold, [0, 0, 0, 0])
            row[0] += p.wrong
            row[1] += p.traps
            row[2] += p.served
            row[3] += p.paraphrases
    return [Point(t, *row) for t, row in sorted(sums.items())]


def at(table: Sequence[Point], threshold: float) -> Point:
    """The table's row for ``threshold``: the loosest row at least as strict (a threshold off
    the grid is measured at the next one up; above the grid, the strictest row)."""
    rows = sorted(table, key=lambda p: p.threshold)
    for p in rows:
        if p.threshold >= threshold - 1e-9:
            return p
    return rows[-1]


@dataclass(frozen=True, slots=True)
class FoldCheck:
    """One fold left out: the threshold the other folds chose, and what the fold did at it."""

    fold: str
    threshold: float  # chosen on the other folds
    held: Point  # the left-out fold at that threshold
    shipped: Point  # the left-out fold at the shipped threshold


@dataclass(frozen=True, slots=True)
class CrossFit:
    risk: float
    shrink: float
    threshold: float  # shipped for ``risk``
    checks: tuple[FoldCheck, ...]

    @property
    def held_wrong(self) -> int:
        return sum(c.held.wrong for c in self.checks)

    @property
    def held_traps(self) -> int:
        return sum(c.held.traps for c in self.checks)

    @property
    def held_bound(self) -> float:
        return upper_bound(self.held_wrong, self.held_traps)

    @property
    def holds(self) -> bool:
        """Every held-out fold within the risk, and the pooled held-out bound too."""
        return self.held_bound <= self.risk and all(
            c.held.traps == 0 or c.held.wrong / c.held.traps <= self.risk for c in self.checks
        )


def _rule(table: Sequence[Point], risk: float) -> float:
    point = choose(table, risk)
    return STRICTEST if point is None else point.threshold


def cross_fit(folds: Mapping[str, Sequence[Point]], risk: float, shrink: float) -> CrossFit:
    """Run the rule at ``shrink * risk`` on all folds but one, for each fold in turn."""
    chosen = {
        name: _rule(pooled(t for other, t in folds.items() if other != name), shrink * risk)
        for name in folds
    }
    threshold = max([_rule(pooled(folds.values()), shrink * risk), *chosen.values()])
    checks = tuple(
        FoldCheck(name, chosen[name], at(folds[name], chosen[name]), at(folds[name], threshold))
        for name in sorted(folds)
    )
    return CrossFit(risk, shrink, threshold, checks)


def ship(folds: Mapping[str, Sequence[Point]], risk: float) -> CrossFit:
    """The cross-fit of the largest shrink that holds out; if none does, the top of the
    tables' grid (only exact and near-repeat wordings served: a verified near repeat scores at
    least 1.0), each fold checked there."""
    for shrink in SHRINKS:
        fit = cross_fit(folds, risk, shrink)
        if fit.holds:
            return fit
    top = max(max(p.threshold for p in table) for table in folds.values())
    checks = tuple(
        FoldCheck(name, top, at(folds[name], top), at(folds[name], top)) for name in sorted(folds)
    )
    return CrossFit(risk, 0.0, max(top, STRICTEST), checks)


def ship_all(
    folds: Mapping[str, Sequence[Point]], risks: Sequence[float] = RISK_LEVELS
) -> list[CrossFit]:
    """``ship`` for each risk, made monotone: a smaller risk never gets a looser threshold."""
    fits = [ship(folds, risk) for risk in sorted(risks)]
    for i in range(1, len(fits)):
        # What held at a smaller risk holds at a larger one: never fall back past it.
        if not fits[i].shrink and fits[i - 1].shrink:
            prev = _at_threshold(folds, fits[i - 1], fits[i - 1].threshold)
            fits[i] = CrossFit(fits[i].risk, prev.shrink, prev.threshold, prev.checks)
    for i in range(len(fits) - 2, -1, -1):
        if fits[i].threshold < fits[i + 1].threshold:
            fits[i] = _at_threshold(folds, fits[i], fits[i + 1].threshold)
    return fits


def _at_threshold(
    folds: Mapping[str, Sequence[Point]], fit: CrossFit, threshold: float
) -> CrossFit:
    checks = tuple(
        FoldCheck(c.fold, c.threshold, c.held, at(folds[c.fold], threshold)) for c in fit.checks
    )
    return CrossFit(fit.risk, fit.shrink, threshold, checks)


def shipped_threshold(
    risks: Mapping[str, Sequence[tuple[float, float]]], key: str, max_error_rate: float
) -> float | None:
    """The shipped threshold of table ``key`` for an operator's risk: that of the largest
    shipped risk level within it; None when the table has none (or the risk is below all)."""
    levels = [(r, t) for r, t in risks.get(key, ()) if r <= max_error_rate + 1e-12]
    return max(levels)[1] if levels else None
