"""`firsttoken cache replay` (the online verification rule on a labelled stream) and
`firsttoken cache report` (per tenant: lookups, hits, verdicts, the threshold in force)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

REPLAY_SETS = "validation,holdout"


def _scores(args: argparse.Namespace) -> list[tuple[float | None, bool]]:
    """Each pair of the sets with the highest threshold of the grid that serves it (None when
    none does): embedded and judged once, or read from --scores."""
    if args.scores and Path(args.scores).is_file():
        return [(s, bool(same)) for s, same in json.loads(Path(args.scores).read_text())]
    from firsttoken.cacheargs import apply_settings, grid, load_sets
    from shared.settings import get_settings
    from workers.cache.evaluate import sweep
    from workers.cache.stage import policy_from
    from workers.embeddings.factory import make_embedder

    apply_settings(args)
    pairs = [p for s in load_sets(args.sets, args.data_dir) for p in s.pairs]
    thresholds = grid("0.55:1.00:0.01")
    embedder = make_embedder(get_settings())
    try:
        hits = sweep(policy_from(get_settings(), embedder.name), embedder, pairs, thresholds)
    finally:
        embedder.close()
    out: list[tuple[float | None, bool]] = []
    for j, pair in enumerate(pairs):
        served_at = [t for t, row in zip(thresholds, hits, strict=True) if row[j]]
        out.append((max(served_at) if served_at else None, pair.same_answer))
    if args.scores:
        Path(args.scores).write_text(json.dumps(out))
    return out


def _cmd_replay(args: argparse.Namespace) -> int:
    from shared.settings import get_settings
    from workers.cache.online import JudgeErrors, Rule
    from workers.cache.replay import Item, replay
    from workers.cache.stage import policy_from

    try:
        scored = _scores(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    items = [Item(s, same) for s, same in scored]
    settings = get_settings()
    base = args.base
    if base is None:
        from workers.embeddings.factory import make_embedder

        embedder = make_embedder(settings)
        base = policy_from(settings, embedder.name).threshold
        embedder.close()
    errors = JudgeErrors(args.judge_error, args.judge_error) if args.correct else JudgeErrors()
    rule = Rule(
        max_error_rate=settings.cache_max_error_rate,
        base=base,
        min_verified=settings.cache_verify_min,
        errors=errors,
    )
    result = replay(
        items,
        rule,
        lookups=args.lookups,
        verify_rate=args.verify_rate,
        band=settings.cache_verify_band,
        judge_error=args.judge_error,
        seed=args.seed,
    )
    rows = [
        {
            "lookups": c.lookups,
            "verified": c.verified,
            "threshold": c.estimate.threshold,
            "estimated": round(c.estimate.rate, 5),
            "bound": round(c.estimate.upper, 5),
            "true": round(c.true_rate, 5),
            "served": round(c.served_share, 4),
        }
        for c in result.checkpoints
    ]
    after = [r for r in rows if r["verified"] >= 500]
    summary = {
        "pairs": len(items),
        "base": base,
        "max_error_rate": rule.max_error_rate,
        "judge_error": args.judge_error,
        "lookups": result.lookups,
        "verified": result.verified,
        "served_share": round(result.same_served / max(1, result.same_lookups), 4),
        "served_wrong_rate": round(result.served_wrong / max(1, result.served), 5),
        "true_under_bound_after_500": all(r["true"] <= r["bound"] for r in after),
        "true_under_risk_after_500": all(r["true"] <= rule.max_error_rate for r in after),
    }
    if args.json:
        print(json.dumps({"summary": summary, "checkpoints": rows}))
        return 0
    print(f"{'lookups':>8} {'verified':>8} {'threshold':>9} {'estimated':>9} {'bound':>7} "
          f"{'true':>7} {'served':>7}")  # fmt: skip
    for r in rows:
        print(
            f"{r['lookups']:>8} {r['verified']:>8} {r['threshold']:>9.2f} "
            f"{r['estimated'] * 100:>8.2f}% {r['bound'] * 100:>6.2f}% {r['true'] * 100:>6.2f}% "
            f"{r['served'] * 100:>6.1f}%"
        )
    print(json.dumps(summary))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from shared.settings import get_settings
    from workers.cache.verdicts import read_report

    rows = asyncio.run(read_report(get_settings()))
    if args.format == "json":
        print(json.dumps(rows))
        return 0
    cols = ("tenant", "lookups", "exact", "semantic", "miss", "verified", "disagree",
            "undecided", "skipped", "est. wrong", "95% bound", "threshold")  # fmt: skip
    print(" ".join(f"{c:>10}" for c in cols))
    for r in rows:
        published = r["threshold"] is not None  # else no worker refreshed it yet
        cells = [r["tenant"], r["lookups"], r["exact"], r["semantic"], r["miss"], r["verified"],
                 r["disagreed"], r["undecided"], r["skipped"],
                 f"{r['estimated'] * 100:.2f}%" if published else "-",
                 f"{r['bound'] * 100:.2f}%" if published else "-",
                 f"{r['threshold']:.2f}" if published else "-"]  # fmt: skip
        print(" ".join(f"{c!s:>10}" for c in cells))
    return 0


def add_parsers(actions: Any) -> None:
    p = actions.add_parser(
        "replay",
        help="Replay labelled pairs as traffic through the online verification rule.",
        description="Each lookup draws a pair of the sets (validation,holdout by default); a "
        "pair is served when its score reaches the threshold in force, a share of hits and "
        "every near miss is verified (the engine's answer is the cached one exactly when the "
        "pair is same-answer; the judge errs --judge-error of the time), and the threshold "
        "moves with the verdicts (workers/cache/online.py). Prints the estimated wrong-serve "
        "rate, its 95% bound and the true rate at the threshold in force.",
    )
    p.add_argument("--sets", default=REPLAY_SETS)
    p.add_argument("--data-dir", default=None)
    p.add_argument(
        "--scores",
        default=None,
        metavar="PATH",
        help="read the pairs' scores from PATH if it exists, else save them there",
    )
    p.add_argument("--lookups", type=int, default=40_000)
    p.add_argument("--verify-rate", type=float, default=0.05)
    p.add_argument("--judge-error", type=float, default=0.0)
    p.add_argument("--correct", action="store_true",
                   help="correct the estimate for the judge's (known) error rate")  # fmt: skip
    p.add_argument("--base", type=float, default=None,
                   help="shipped threshold to start from (default: the worker's)")  # fmt: skip
    p.add_argument("--seed", type=int, default=45)
    p.add_argument("--setting", action="append", metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_replay)
    p = actions.add_parser(
        "report",
        help="Per tenant: lookups, hits by tier, verifications, the wrong-serve estimate.",
        description="Read the cache's per-tenant counters and verdicts from Redis and print, per "
        "tenant, lookups, hits by tier, verified lookups, disagreements, verifications "
        "skipped (every slot busy, waited too long, or refused by the tenant's rate limits), the "
        "estimated wrong-serve rate with its 95% upper bound, and the threshold in force.",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(fn=_cmd_report)
