"""How well a verification judge tells agreeing answers from disagreeing ones, on labelled answer
pairs (tests/data/answers/), by fold. Pure: the scores come from the caller.

A judge's two errors weigh differently. Saying *agree* to answers that do not agree
(``false_agree``) hides a wrong serve, so the estimated wrong-serve rate comes out too low: the
promise breaks. Saying *disagree* to answers that agree (``false_disagree``) reports wrong
serves that were not, so the threshold rises and the entry is dropped: the cache serves less.
A judge with a score (the embedding judge's cosine, a cross-encoder's score) is cut where its
false agreements stay within ``max_false_agree`` on the folds it is fitted to, and checked on
the one left out; a judge with a verdict (the LLM judge) is only checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ANSWERS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "answers"


@dataclass(frozen=True, slots=True)
class AnswerPair:
    question: str
    cached: str  # the answer served
    fresh: str  # the engine's own answer
    same: bool  # the served answer agrees with the engine's on everything that matters
    category: str


@dataclass(frozen=True, slots=True)
class JudgeRates:
    """A judge's verdicts on one set of pairs; ``None`` verdicts (undecided) count apart."""

    agreeing: int  # pairs labelled same, with a verdict
    disagreeing: int  # pairs labelled different, with a verdict
    false_disagree: int
    false_agree: int
    undecided: int = 0

    @property
    def false_disagree_rate(self) -> float:
        return self.false_disagree / self.agreeing if self.agreeing else 0.0

    @property
    def false_agree_rate(self) -> float:
        return self.false_agree / self.disagreeing if self.disagreeing else 0.0

    def __add__(self, other: JudgeRates) -> JudgeRates:
        return JudgeRates(
            self.agreeing + other.agreeing,
            self.disagreeing + other.disagreeing,
            self.false_disagree + other.false_disagree,
            self.false_agree + other.false_agree,
            self.undecided + other.undecided,
        )


@dataclass(frozen=True, slots=True)
class FoldResult:
    fold: str
    cut: float | None  # fitted on the other folds (None: a verdict judge, or no cut held)
    rates: JudgeRates  # on this fold, held out


def load_answer_folds(root: Path = ANSWERS_DIR) -> dict[str, list[AnswerPair]]:
    """Each answers_*.jsonl file of ``root`` is a fold, named by what follows `answers_`."""
    folds: dict[str, list[AnswerPair]] = {}
    for path in sorted(root.glob("answers_*.jsonl")):
        pairs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row["same"], bool):
                    raise ValueError(f"same is {row['same']!r}, not true or false")
                pairs.append(AnswerPair(row["q"], row["a"], row["b"], row["same"], row["category"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not an answer pair ({exc})") from None
        folds[path.stem.removeprefix("answers_")] = pairs
    if not folds:
        raise ValueError(f"no answers_*.jsonl files in {root}")
    return folds


def verdict_rates(verdicts: Sequence[bool | None], labels: Sequence[bool]) -> JudgeRates:
    """The rates of a judge's verdicts (True: agree) against the labels."""
    agreeing = disagreeing = fd = fa = undecided = 0
    for verdict, same in zip(verdicts, labels, strict=True):
        if verdict is None:
            undecided += 1
        elif same:
            agreeing += 1
            fd += not verdict
        else:
            disagreeing += 1
            fa += verdict
    return JudgeRates(agreeing, disagreeing, fd, fa, undecided)


def cut_rates(scores: Sequence[float], labels: Sequence[bool], cut: float) -> JudgeRates:
    return verdict_rates([s >= cut for s in scores], labels)


def fit_cut(
    scores: Sequence[float], labels: Sequence[bool], max_false_agree: float
) -> float | None:
    """The lowest cut whose false agreements are within ``max_false_agree`` (the lowest: it
    calls the fewest agreeing answers wrong), among the scores themselves (so any judge's scale
    does: a cosine, a cross-encoder's probability or logit); None when no cut keeps any
    agreeing pair above it within that."""
    for cut in sorted(set(scores)):
        rates = cut_rates(scores, labels, cut)
        if rates.false_agree_rate <= max_false_agree and rates.false_disagree < rates.agreeing:
            return cut
    return None


def leave_one_out(
    scores: Mapping[str, Sequence[float]],
    labels: Mapping[str, Sequence[bool]],
    max_false_agree: float,
) -> list[FoldResult]:
    """For each fold, the cut fitted on the others, and its rates on this one."""
    out = []
    folds = list(scores)
    for fold in folds:
        fit_scores = [s for f in folds if f != fold for s in scores[f]]
        fit_labels = [y for f in folds if f != fold for y in labels[f]]
        cut = fit_cut(fit_scores, fit_labels, max_false_agree)
        rates = (
            cut_rates(scores[fold], labels[fold], cut)
            if cut is not None
            else verdict_rates([False] * len(labels[fold]), labels[fold])
        )
        out.append(FoldResult(fold, cut, rates))
    return out


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The chance that an agreeing pair scores above a disagreeing one (ties count half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))
