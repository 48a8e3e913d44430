"""`firsttoken cache judge-eval`: how well the verification judge tells agreeing answers from
disagreeing ones, on the labelled answer pairs (tests/data/answers/), fold by fold.

The embedding and score judges are cut where their false agreements stay within
``--max-false-agree`` on the other folds and checked on the one left out; the LLM judge asks the
configured engine each pair's question (as a verification would) and is checked on every fold.
The rates it prints are what `FIRSTTOKEN_CACHE_VERIFY_FALSE_AGREE` and
`FIRSTTOKEN_CACHE_VERIFY_FALSE_DISAGREE` take, so the online estimate corrects for the judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def _embedding_scores(pairs: list[Any]) -> list[float]:
    import numpy as np

    from shared.settings import get_settings
    from workers.embeddings.factory import make_embedder

    embedder = make_embedder(get_settings())
    try:
        a = np.asarray(embedder.embed([p.cached for p in pairs]))
        b = np.asarray(embedder.embed([p.fresh for p in pairs]))
    finally:
        embedder.close()
    return [float(x) for x in np.sum(a * b, axis=1)]


async def _score_scores(pairs: list[Any], url: str) -> list[float]:
    import httpx

    from workers.cache.checker import score_answers

    async with httpx.AsyncClient(timeout=60) as client:
        scores = []
        for p in pairs:
            score = await score_answers(url, p.cached, p.fresh, client)
            if score is None:
                raise ValueError(f"{url} answered without a score")
            scores.append(score)
    return scores


async def _llm_verdicts(pairs: list[Any], concurrency: int) -> list[bool | None]:
    from shared.modeltable import model_table
    from shared.settings import get_settings
    from workers.cache.checker import judge_question
    from workers.cache.online import parse_yes_no
    from workers.engines.base import EngineRequest
    from workers.engines.factory import make_model_engine

    settings = get_settings()
    spec = model_table(settings).get(None)
    engine = make_model_engine(spec, settings)
    slots = asyncio.Semaphore(concurrency)

    async def ask(n: int, pair: Any) -> bool | None:
        request = EngineRequest(
            messages=judge_question(pair.question, pair.cached, pair.fresh),
            model=spec.engine_model,
            max_tokens=3,
            temperature=0.0,
        )
        async with slots:
            parts = [d.text async for d in engine.stream(request, request_id=f"judge-eval-{n}")]
        return parse_yes_no("".join(parts))

    try:
        # A TaskGroup: one failure (the engine unreachable) cancels the other questions.
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(ask(n, p)) for n, p in enumerate(pairs)]
        return [task.result() for task in tasks]
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    finally:
        await engine.aclose()


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.1f}%)" if d else "-"


def _cmd_judge_eval(args: argparse.Namespace) -> int:
    from firsttoken.cacheargs import apply_settings
    from shared.errors import EngineError
    from shared.settings import get_settings
    from workers.cache.judgecal import (
        ANSWERS_DIR,
        auc,
        leave_one_out,
        load_answer_folds,
        verdict_rates,
    )

    try:
        apply_settings(args)
    except ValueError as exc:
        return fail(str(exc))
    settings = get_settings()
    judge = args.judge or settings.cache_verify_judge
    if args.concurrency < 1:
        return fail("--concurrency must be at least 1")
    try:
        folds = load_answer_folds(Path(args.data_dir) if args.data_dir else ANSWERS_DIR)
    except (OSError, ValueError) as exc:
        return fail(
            f"cannot read the answer pairs: {exc} (a checkout has them in tests/data/answers; "
            "elsewhere give --data-dir)"
        )
    labels = {f: [p.same for p in pairs] for f, pairs in folds.items()}
    every = [p for pairs in folds.values() for p in pairs]
    out: dict[str, Any] = {"judge": judge, "max_false_agree": args.max_false_agree, "folds": []}
    try:
        if judge == "llm":
            verdicts = asyncio.run(_llm_verdicts(every, args.concurrency))
            start = 0
            for fold, pairs in folds.items():
                rates = verdict_rates(verdicts[start : start + len(pairs)], labels[fold])
                start += len(pairs)
                out["folds"].append(_row(fold, None, None, rates))
        else:
            if judge == "score":
                url = settings.cache_verify_score_url
                if not url:
                    return fail("the score judge needs FIRSTTOKEN_CACHE_VERIFY_SCORE_URL")
                flat = asyncio.run(_score_scores(every, url))
            else:
                flat = _embedding_scores(every)
            scores, start = {}, 0
            for fold, pairs in folds.items():
                scores[fold] = flat[start : start + len(pairs)]
                start += len(pairs)
            for result in leave_one_out(scores, labels, args.max_false_agree):
                fold_auc = auc(scores[result.fold], labels[result.fold])
                out["folds"].append(_row(result.fold, result.cut, fold_auc, result.rates))
    except (OSError, ValueError, EngineError) as exc:
        return fail(f"the {judge} judge could not be run: {exc}")
    pooled = [r["_rates"] for r in out["folds"]]
    total = pooled[0]
    for rates in pooled[1:]:
        total = total + rates
    out["pooled"] = _row("pooled", None, None, total)
    for row in [*out["folds"], out["pooled"]]:
        row.pop("_rates")
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"judge {judge}" + ("" if judge == "llm" else f", cut fitted on the other folds with "
          f"false agreements <= {args.max_false_agree:.0%}"))  # fmt: skip
    print(f"{'fold':<8} {'AUC':>5} {'cut':>5} {'false disagree':>18} {'false agree':>18} "
          f"{'undecided':>9}")  # fmt: skip
    for row in [*out["folds"], out["pooled"]]:
        print(
            f"{row['fold']:<8} {_opt(row['auc'], '.3f'):>5} {_opt(row['cut'], '.2f'):>5} "
            f"{_pct(row['false_disagree'], row['agreeing']):>18} "
            f"{_pct(row['false_agree'], row['disagreeing']):>18} {row['undecided']:>9}"
        )
    return 0


def _opt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _row(fold: str, cut: float | None, fold_auc: float | None, rates: Any) -> dict[str, Any]:
    return {
        "fold": fold,
        "cut": cut,
        "auc": None if fold_auc is None else round(fold_auc, 4),
        "agreeing": rates.agreeing,
        "disagreeing": rates.disagreeing,
        "false_disagree": rates.false_disagree,
        "false_agree": rates.false_agree,
        "false_disagree_rate": round(rates.false_disagree_rate, 4),
        "false_agree_rate": round(rates.false_agree_rate, 4),
        "undecided": rates.undecided,
        "_rates": rates,
    }


def add_parser(actions: Any) -> None:
    p = actions.add_parser(
        "judge-eval",
        help="How well the verification judge tells agreeing answers apart, by fold.",
        description="Run the cache verification's judge over the labelled answer pairs "
        "(tests/data/answers/: a cached answer, the engine's, whether they agree), one fold per "
        "file. The embedding and score judges get the lowest cut whose false agreements stay "
        "within --max-false-agree on the other folds, checked on the fold left out; the llm "
        "judge asks the engine the workers use (FIRSTTOKEN_ENGINE, FIRSTTOKEN_ENGINE_URL: the "
        "default model). Prints each fold's false disagreements (agreeing "
        "answers judged wrong: the cache serves less) and false agreements (wrong answers "
        "judged right: the estimate hides them), the rates the estimate's correction takes.",
    )
    p.add_argument("--judge", choices=["embedding", "llm", "score"], default=None,
                   help="the judge to run (default: FIRSTTOKEN_CACHE_VERIFY_JUDGE)")  # fmt: skip
    p.add_argument("--max-false-agree", type=float, default=0.05, metavar="RATE")
    p.add_argument("--concurrency", type=int, default=8,
                   help="llm judge: questions to the engine at once")  # fmt: skip
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="a folder of answers_*.jsonl (default: tests/data/answers)")  # fmt: skip
    p.add_argument("--setting", action="append", metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_judge_eval)
