"""`firsttoken cache eval PAIRS.jsonl [--threshold T] [--json] [--mode M]`, `firsttoken cache
prepare`."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _cmd_eval(args: argparse.Namespace) -> int:
    from shared.cache.evaluate import load_file, report, served
    from shared.cache.policy import Policy
    from shared.embeddings.factory import make_embedder
    from shared.settings import get_settings

    settings = get_settings()
    policy = Policy(
        threshold=args.threshold if args.threshold is not None else settings.cache_threshold,
        context_threshold=settings.cache_context_threshold,
        context_messages=settings.cache_context_messages,
    )
    pairs = load_file(args.pairs)
    embedder = make_embedder(settings)
    try:
        result = report(pairs, served(policy, embedder, pairs, args.mode))
    finally:
        embedder.close()
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        _print_table(result, policy.threshold, len(pairs))
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from shared.embeddings.factory import make_embedder
    from shared.settings import get_settings

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
        "of same_answer pairs served (served_rate) and of the others served (wrong_serve_rate).",
    )
    p.add_argument(
        "pairs", help='JSONL: {"a": ..., "b": ..., "same_answer": bool, "category": ...}'
    )
    p.add_argument("--threshold", type=float, default=None, help="similarity threshold")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--mode",
        choices=["guarded", "cosine", "last_message"],
        default="guarded",
        help="guarded (what the worker serves), cosine (threshold only: baseline), "
        "last_message (conversation context ignored: baseline)",
    )
    p.set_defaults(fn=_cmd_eval)
    p = actions.add_parser(
        "prepare",
        help="Build the int8 embedding model now (workers otherwise build it at first start).",
        description="Build the int8 MiniLM from the shipped model into FIRSTTOKEN_EMBED_CACHE_DIR "
        "(about 5 s, once per machine; a chat worker does it at its first start otherwise) and "
        "print its path.",
    )
    p.set_defaults(fn=_cmd_prepare)
