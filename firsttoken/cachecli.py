"""`firsttoken cache eval [PAIRS.jsonl] [--sets S,...] [--threshold T] [--setting K=V] [--json]
[--mode M]`, `firsttoken cache calibrate [--sets S,...] [--grid L:H:S] [--write]`,
`firsttoken cache prepare`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from firsttoken.cacheargs import apply_settings, grid, load_sets

if TYPE_CHECKING:
    from workers.cache.calibration import Point
    from workers.cache.evaluate import PairSet
    from workers.cache.policy import Policy
    from workers.embeddings.base import Embedder


def _cmd_eval(args: argparse.Namespace) -> int:
    from shared.settings import get_settings
    from workers.cache.stage import policy_from
    from workers.embeddings.factory import make_embedder

    if args.pairs and args.sets is not None:
        print("error: give a PAIRS file or --sets, not both", file=sys.stderr)
        return 2
    try:
        apply_settings(args)
        pair_sets = None if args.pairs else load_sets(args.sets, args.data_dir)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    embedder = make_embedder(get_settings())
    policy = policy_from(get_settings(), embedder.name)
    try:
        if pair_sets is None:
            return _eval_file(args, policy, embedder)
        return _eval_sets(args, policy, embedder, pair_sets)
    finally:
        embedder.close()


def _eval_file(args: argparse.Namespace, policy: Policy, embedder: Embedder) -> int:
    from workers.cache.evaluate import load_file, report, served

    pairs = load_file(args.pairs)
    result = report(pairs, served(policy, embedder, pairs, args.mode))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        _print_table(result, policy.threshold, len(pairs))
    return 0


def _eval_sets(
    args: argparse.Namespace, policy: Policy, embedder: Embedder, pair_sets: list[PairSet]
) -> int:
    from workers.cache.evaluate import served, set_report

    results: dict[str, Any] = {}
    for pair_set in pair_sets:
        pairs = pair_set.pairs
        print(f"{pair_set.name}: {len(pairs)} pairs ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        hits = served(policy, embedder, pairs, args.mode)
        elapsed = time.monotonic() - started
        print(f"{pair_set.name}: done in {elapsed:.1f} s", file=sys.stderr, flush=True)
        results[pair_set.name] = set_report(pair_set, hits)
    out = {"threshold": policy.threshold, "mode": args.mode, "sets": results}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        _print_sets(out)
    return 0


CALIBRATED = Path(__file__).resolve().parents[1] / "workers" / "cache" / "calibrated.json"


def calibration_points(
    policy: Policy, embedder: Embedder, pair_sets: list[PairSet], thresholds: list[float]
) -> list[Point]:
    """Traps and paraphrases served at each threshold, over every pair of ``pair_sets``."""
    from workers.cache.calibration import Point
    from workers.cache.evaluate import sweep

    pairs = [p for pair_set in pair_sets for p in pair_set.pairs]
    traps = sum(1 for p in pairs if not p.same_answer)
    points = []
    for threshold, hits in zip(thresholds, sweep(policy, embedder, pairs, thresholds), strict=True):
        wrong = sum(1 for p, hit in zip(pairs, hits, strict=True) if hit and not p.same_answer)
        ok = sum(1 for p, hit in zip(pairs, hits, strict=True) if hit and p.same_answer)
        points.append(Point(round(threshold, 4), wrong, traps, ok, len(pairs) - traps))
    return points


def render_calibrated(
    tables: dict[str, list[Point]],
    sets: str,
    folds: dict[str, dict[str, list[Point]]] | None = None,
    risks: dict[str, list[tuple[float, float]]] | None = None,
) -> str:
    """The text of workers/cache/calibrated.json for ``tables`` (and, from `--folds`, each
    table's folds and the thresholds shipped per risk, workers/cache/folds.py)."""
    from workers.cache.calibrated import render

    return render(tables, sets, folds, risks)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from shared.settings import get_settings
    from workers.cache.calibration import choose
    from workers.cache.stage import policy_from
    from workers.cache.verify import table_key
    from workers.embeddings.factory import make_embedder

    try:
        apply_settings(args)
        sets = args.sets or ("dev,validation,holdout" if args.folds else "validation")
        pair_sets = load_sets(sets, args.data_dir)
        thresholds = grid(args.grid)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.folds and args.points and Path(args.points).is_file():
        saved = json.loads(Path(args.points).read_text())
        name, folds = saved["table"], _folds_from_json(saved["folds"])
        return _finish_folds(args, name, folds, sets)
    embedder = make_embedder(get_settings())
    try:
        # The verifier set, even when its table is still missing (policy_from then falls back
        # to the plain cosine): this run makes that table.
        policy = replace(
            policy_from(get_settings(), embedder.name), verifier=get_settings().cache_verifier
        )
        name = table_key(embedder.name, policy.verifier)
        print(f"{name}: {len(thresholds)} thresholds ...", file=sys.stderr, flush=True)
        if args.folds:
            folds = fold_tables(policy, embedder, pair_sets, thresholds)
        else:
            points = calibration_points(policy, embedder, pair_sets, thresholds)
    finally:
        embedder.close()
    if args.folds:
        if args.points:
            Path(args.points).write_text(json.dumps({"table": name, "folds": _folds_json(folds)}))
        return _finish_folds(args, name, folds, sets)
    print(f"{'threshold':>9} {'wrong':>11} {'95% bound':>9} {'served':>11}")
    for p in points:
        print(
            f"{p.threshold:>9.3f} {p.wrong:>5}/{p.traps:<5} {p.error_bound * 100:>8.2f}% "
            f"{p.served:>5}/{p.paraphrases:<5}"
        )
    for risk in (0.005, 0.01, 0.02, 0.05):
        chosen = choose(points, risk)
        print(f"max error rate {risk}: threshold {chosen.threshold if chosen else 'none'}")
    if args.write:
        _write_tables(name, points, sets, None, None)
    return 0


def _write_tables(
    name: str,
    points: list[Point],
    sets: str,
    folds: dict[str, list[Point]] | None,
    risks: list[tuple[float, float]] | None,
) -> None:
    """Replace table ``name`` (and its folds and risks, when given) in calibrated.json, keeping
    the other models' tables."""
    from workers.cache import calibrated

    tables = {n: list(rows) for n, rows in calibrated.CALIBRATION.items()}
    all_folds = {n: {f: list(r) for f, r in fs.items()} for n, fs in calibrated.FOLDS.items()}
    all_risks = {n: list(rs) for n, rs in calibrated.RISKS.items()}
    tables[name] = points
    if folds is not None and risks is not None:
        all_folds[name], all_risks[name] = folds, risks
    else:  # a plain calibration replaces the table: its old folds no longer describe it
        all_folds.pop(name, None)
        all_risks.pop(name, None)
    CALIBRATED.write_text(render_calibrated(tables, sets, all_folds, all_risks))
    print(f"wrote {CALIBRATED}")


def fold_tables(
    policy: Policy, embedder: Embedder, pair_sets: list[PairSet], thresholds: list[float]
) -> dict[str, list[Point]]:
    """Every pair of every set embedded and judged once per threshold, then counted by fold
    (workers/cache/folds.py ``fold_of``)."""
    from workers.cache.evaluate import sweep
    from workers.cache.folds import fold_of, fold_points

    pairs, names = [], []
    for pair_set in pair_sets:
        for file_name, file_pairs in pair_set.files.items():
            for p in file_pairs:
                pairs.append(p)
                names.append(fold_of(pair_set.name, file_name, p.category, p.b[-1].content))
    started = time.monotonic()
    hits = sweep(policy, embedder, pairs, thresholds)
    print(f"{len(pairs)} pairs in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return fold_points(thresholds, hits, [p.same_answer for p in pairs], names)


def _folds_from_json(raw: dict[str, list[list[float]]]) -> dict[str, list[Point]]:
    from workers.cache.calibration import Point

    return {
        fold: [Point(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]
        for fold, rows in raw.items()
    }


def _folds_json(folds: dict[str, list[Point]]) -> dict[str, list[list[float]]]:
    return {
        f: [[p.threshold, p.wrong, p.traps, p.served, p.paraphrases] for p in rows]
        for f, rows in folds.items()
    }


def _pct(n: int, d: int) -> str:
    return "-" if d == 0 else f"{n / d * 100:5.1f}% {n:>3}/{d:<3}"


def _finish_folds(
    args: argparse.Namespace, name: str, folds: dict[str, list[Point]], sets: str
) -> int:
    """Print, per risk level, each fold left out (the threshold the other folds chose, what the
    fold did at it, and at the threshold shipped), then with --write store the tables."""
    from workers.cache.folds import pooled, ship_all

    risks = []
    for fit in ship_all(folds):
        risk = fit.risk
        risks.append((risk, fit.threshold))
        print(
            f"\nmax error rate {risk}: shipped threshold {fit.threshold} (rule at "
            f"{fit.shrink:g} x risk{'; no rule held: top of the grid' if not fit.shrink else ''}"
            f"); held out, all folds: wrong {fit.held_wrong}/"
            f"{fit.held_traps}, 95% bound {fit.held_bound * 100:.2f}%, "
            f"{'holds' if fit.holds else 'DOES NOT HOLD'}"
        )
        print(
            f"  {'fold':<14} {'t (rest)':>8} {'held-out served':>17} {'held-out wrong':>17} "
            f"{'bound':>7} {'shipped served':>17} {'shipped wrong':>17}"
        )
        for c in fit.checks:
            h, s = c.held, c.shipped
            print(
                f"  {c.fold:<14} {c.threshold:>8.2f} {_pct(h.served, h.paraphrases):>17} "
                f"{_pct(h.wrong, h.traps):>17} {h.error_bound * 100:>6.2f}% "
                f"{_pct(s.served, s.paraphrases):>17} {_pct(s.wrong, s.traps):>17}"
            )
    if args.json:
        print(json.dumps({"table": name, "risks": risks, "folds": _folds_json(folds)}))
    if args.write:
        _write_tables(name, pooled(folds.values()), sets, folds, risks)
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from shared.settings import get_settings
    from workers.embeddings.factory import make_embedder

    settings = get_settings()
    if settings.embed_backend != "onnx":
        print(f"nothing to prepare: FIRSTTOKEN_EMBED_BACKEND={settings.embed_backend}")
        return 0
    embedder = make_embedder(settings)  # builds the int8 model unless it is there already
    try:
        print(f"embedding model ready: {getattr(embedder, 'model_path', embedder.name)}")
    finally:
        embedder.close()
    return 0


def _fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:5.1f}%"


def _print_table(result: dict[str, Any], threshold: float, n: int) -> None:
    print(f"{n} pairs, threshold {threshold}")
    print(f"{'category':<24} {'pairs':>5} {'served':>8} {'wrong':>8}")
    for name, row in result["by_category"].items():
        print(
            f"{name:<24} {row['pairs']:>5} {_fmt(row['served_rate']):>8} "
            f"{_fmt(row['wrong_serve_rate']):>8}"
        )
    print(
        f"{'all':<24} {n:>5} {_fmt(result['served_rate']):>8} {_fmt(result['wrong_serve_rate']):>8}"
    )


def _cell(row: dict[str, Any] | None, rate: str) -> str:
    return "" if row is None else f"{_fmt(row[rate]).strip()} /{row['pairs']}"


def _print_sets(out: dict[str, Any]) -> None:
    """One row per set, then one row per kind and rate with the sets side by side."""
    sets: dict[str, Any] = out["sets"]
    print(f"threshold {out['threshold']}, mode {out['mode']}")
    print(f"{'set':<12} {'pairs':>6} {'served':>8} {'wrong':>8}")
    for name, row in sets.items():
        print(
            f"{name:<12} {row['pairs']:>6} {_fmt(row['served_rate']):>8} "
            f"{_fmt(row['wrong_serve_rate']):>8}"
        )
    print()
    print(f"{'kind':<28} {'rate':<7}" + "".join(f" {n:>11}" for n in sets))
    kinds = sorted({k for row in sets.values() for k in row["by_kind"]})
    for k in kinds:
        for rate, label in (("served_rate", "served"), ("wrong_serve_rate", "wrong")):
            cells = [row["by_kind"].get(k) for row in sets.values()]
            if all(c is None or c[rate] is None for c in cells):
                continue
            text = "".join(f" {_cell(c, rate):>11}" for c in cells)
            print(f"{k:<28} {label:<7}{text}")


def add_parser(subparsers: Any) -> None:
    """Register `cache` and its `eval` and `prepare` actions on the top-level subparsers."""
    cache = subparsers.add_parser(
        "cache", help="Semantic cache tools.", description="Semantic cache tools."
    )
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "eval",
        help="Measure served and wrong-serve rates on question pairs (JSONL).",
        description="Cache each pair's `a` with a fixed answer, look up `b`, and report the share "
        "of same_answer pairs served (served_rate) and of the others served (wrong_serve_rate). "
        "With no PAIRS file, every set named by --sets is evaluated and reported side by side: "
        "dev (tests/data/*.jsonl, the set the cache's rules are tuned on), validation "
        "(tests/data/validation/*.jsonl, written independently of the rules) and holdout "
        "(tests/data/validation/holdout/*.jsonl, frozen, never for tuning).",
    )
    p.add_argument(
        "pairs",
        nargs="?",
        help='one JSONL file: {"a": ..., "b": ..., "same_answer": bool, "category": ...}; '
        "its JSON output is the single-set shape (served_rate, wrong_serve_rate, by_category)",
    )
    p.add_argument(
        "--sets",
        default=None,
        help="comma-separated sets to evaluate when no PAIRS file is given: dev, validation, "
        "holdout (default: dev,validation)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="the tests/data directory holding the sets (default: the checkout's, found beside "
        "the installed package)",
    )
    p.add_argument("--threshold", type=float, default=None, help="similarity threshold")
    p.add_argument(
        "--setting",
        action="append",
        metavar="KEY=VALUE",
        help="set FIRSTTOKEN_CACHE_KEY=VALUE before the worker's cache policy is built, for any "
        "cache setting (e.g. context_threshold=0.9); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--mode",
        choices=["guarded", "cosine", "last_message", "stored"],
        default="guarded",
        help="guarded (what the worker serves), cosine (threshold only: baseline), "
        "last_message (conversation context ignored: baseline), stored (each side a turn of a "
        "server-stored conversation: its earlier turns stored, the last message sent alone)",
    )
    p.set_defaults(fn=_cmd_eval)
    p = actions.add_parser(
        "calibrate",
        help="Measure traps and paraphrases served per similarity threshold.",
        description="Evaluate the sets at each threshold of --grid with the worker's own policy, "
        "print traps served (with the 95% upper bound that FIRSTTOKEN_CACHE_MAX_ERROR_RATE is "
        "compared with) and paraphrases served, and with --write store the table for this "
        "embedding model in workers/cache/calibrated.json, where the workers choose their "
        "threshold from it. Calibrate on validation; report holdout only as a final check.",
    )
    p.add_argument(
        "--sets",
        default=None,
        help="comma-separated sets to calibrate on (default: validation; with --folds "
        "dev,validation,holdout)",
    )
    p.add_argument("--data-dir", default=None, help="the tests/data directory holding the sets")
    p.add_argument(
        "--grid",
        default="0.55:1.00:0.01",
        # The verified score of a broad rewording sits above its cosine: its table needs
        # thresholds up to 1.
        help="thresholds as LOW:HIGH:STEP (default: 0.55:1.00:0.01)",
    )
    p.add_argument(
        "--setting",
        action="append",
        metavar="KEY=VALUE",
        help="set FIRSTTOKEN_CACHE_KEY=VALUE first, as for eval; repeatable",
    )
    p.add_argument("--write", action="store_true", help="store the table in calibrated.json")
    p.add_argument(
        "--folds",
        action="store_true",
        help="leave-one-fold-out over the sets by language (default sets: dev,validation,"
        "holdout): per risk, each fold checked at the threshold the other folds chose; --write "
        "ships the threshold that holds on every fold (workers/cache/folds.py)",
    )
    p.add_argument(
        "--points",
        default=None,
        metavar="PATH",
        help="with --folds: read the fold tables from PATH if it exists (no embedding), else "
        "measure them and save them there",
    )
    p.add_argument("--json", action="store_true", help="with --folds: also print JSON")
    p.set_defaults(fn=_cmd_calibrate)
    p = actions.add_parser(
        "prepare",
        help="Build the int8 embedding model now (workers otherwise build it at first start).",
        description="Build the int8 MiniLM from the shipped model into FIRSTTOKEN_EMBED_CACHE_DIR "
        "(about 5 s, once per machine; a chat worker does it at its first start otherwise) and "
        "print its path.",
    )
    p.set_defaults(fn=_cmd_prepare)
    from firsttoken.cachejudge import add_parser as add_judge_eval
    from firsttoken.cacheonline import add_parsers

    add_parsers(actions)
    add_judge_eval(actions)
