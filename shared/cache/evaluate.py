"""`firsttoken cache eval`: cache `a` with a fixed answer, look up `b`, count what is served.

Uses the same Query/judge as the worker. Two baselines are measured the same way: plain cosine
(threshold only, no guards, no context check) and last-message-only (the guards, but the
conversation context ignored).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shared.cache.policy import Candidate, Policy, Query, judge
from shared.embeddings.base import Embedder
from shared.protocol import Message

Mode = Literal["guarded", "cosine", "last_message"]


@dataclass(frozen=True, slots=True)
class Pair:
    a: list[Message]
    b: list[Message]
    same_answer: bool
    category: str


def _messages(value: Any) -> list[Message]:
    if isinstance(value, str):
        return [Message(role="user", content=value)]
    return [Message.model_validate(m) for m in value]


def load_pairs(lines: Iterable[str]) -> list[Pair]:
    pairs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            msgs_a, msgs_b = _messages(row["a"]), _messages(row["b"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {n}: {exc}") from exc
        if msgs_a[-1].role != "user" or msgs_b[-1].role != "user":
            raise ValueError(f"line {n}: a and b must end with a user message")
        pairs.append(Pair(msgs_a, msgs_b, bool(row["same_answer"]), row.get("category") or ""))
    return pairs


def load_file(path: str | Path) -> list[Pair]:
    with open(path, encoding="utf-8") as fh:
        return load_pairs(fh)


def _query(policy: Policy, messages: list[Message], embedder: str, mode: Mode) -> Query:
    if mode == "last_message":
        messages = [messages[-1]]
    return Query(
        policy,
        tenant="eval",
        model="eval",
        embedder=embedder,
        messages=messages,
        max_tokens=256,
        temperature=None,
    )


def served(
    policy: Policy, embedder: Embedder, pairs: list[Pair], mode: Mode = "guarded"
) -> list[bool]:
    """For each pair: would `b` be answered by the entry cached for `a`?"""
    qa = [_query(policy, p.a, embedder.name, mode) for p in pairs]
    qb = [_query(policy, p.b, embedder.name, mode) for p in pairs]
    vecs = embedder.embed([q.embed_question for q in qa + qb])
    va, vb = vecs[: len(pairs)], vecs[len(pairs) :]
    ctx_texts = sorted({q.embed_context for q in qa + qb if q.embed_context})
    ctx_vecs = dict(zip(ctx_texts, embedder.embed(ctx_texts), strict=True)) if ctx_texts else {}
    out = []
    for a, b, x, y in zip(qa, qb, va, vb, strict=True):
        if a.exact == b.exact:
            out.append(True)
            continue
        score = float(np.dot(x, y))
        if mode == "cosine":
            out.append(score >= policy.threshold)
            continue
        candidate = Candidate(
            question=a.raw_question,
            context=a.turn.context_text,
            context_key=a.context,
            context_vector=ctx_vecs.get(a.embed_context),
            completion_tokens=1,
        )
        out.append(judge(policy, b, candidate, score, ctx_vecs.get(b.embed_context)) is None)
    return out


def _rates(rows: list[tuple[Pair, bool]]) -> dict[str, Any]:
    same = [hit for p, hit in rows if p.same_answer]
    other = [hit for p, hit in rows if not p.same_answer]
    return {
        "served_rate": round(sum(same) / len(same), 4) if same else None,
        "wrong_serve_rate": round(sum(other) / len(other), 4) if other else None,
        "pairs": len(rows),
    }


def report(pairs: list[Pair], hits: list[bool]) -> dict[str, Any]:
    """`served_rate`, `wrong_serve_rate` and the same per category (`by_category`)."""
    rows = list(zip(pairs, hits, strict=True))
    overall = _rates(rows)
    by_category: dict[str, Any] = {}
    for category in sorted({p.category for p in pairs}):
        by_category[category or "-"] = _rates([r for r in rows if r[0].category == category])
    return {
        "served_rate": overall["served_rate"],
        "wrong_serve_rate": overall["wrong_serve_rate"],
        "by_category": by_category,
    }
