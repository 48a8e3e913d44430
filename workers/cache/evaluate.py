"""`firsttoken cache eval`: cache `a` with a fixed answer, look up `b`, count what is served.

Uses the same Query/judge as the worker. Two baselines are measured the same way: plain cosine
(threshold only, no guards, no context check) and last-message-only (the guards, but the
conversation context ignored). Mode ``stored`` looks each side up as a turn of a server-stored
conversation: its earlier turns are the stored history (through the worker's window, default
rules) and only its system messages and last message are sent, keyed as the chat worker keys
such a turn (workers/cache/conversation.py).

The pair sets live in the checkout's ``tests/data``: the development set the rules are tuned on
(``*.jsonl``), a validation set written independently of the rules (``validation/*.jsonl``) and a
frozen holdout from the same authoring (``validation/holdout/*.jsonl``), never used for tuning.
Reporting them side by side shows how far a change generalises beyond the set it was made on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shared.protocol import Message
from workers.cache.conversation import stored_turn
from workers.cache.policy import Candidate, Policy, Query, judge
from workers.embeddings.base import Embedder

Mode = Literal["guarded", "cosine", "last_message", "stored"]

SET_NAMES = ("dev", "validation", "holdout")
DEFAULT_SETS = ("dev", "validation")


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


def as_stored(messages: list[Message]) -> list[Message]:
    """``messages`` as the chat worker keys them when their earlier turns are a stored
    conversation's and the client sends only its system messages and the last one."""
    from workers.conversation import StoredMessage, WindowRules, select_window
    from workers.prompt import counter_for

    own = [m for m in messages if m.role == "system"] + [messages[-1]]
    stored = [
        StoredMessage(i, m.role, m.content)
        for i, m in enumerate(messages[:-1])
        if m.role != "system"
    ]
    window = select_window(stored, None, None, WindowRules(), counter_for(None))
    return stored_turn(own, window.history, window.summary)


def _query(policy: Policy, messages: list[Message], embedder: str, mode: Mode) -> Query:
    if mode == "last_message":
        messages = [messages[-1]]
    elif mode == "stored":
        messages = as_stored(messages)
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
    return sweep(policy, embedder, pairs, [policy.threshold], mode)[0]


def sweep(
    policy: Policy,
    embedder: Embedder,
    pairs: list[Pair],
    thresholds: Sequence[float],
    mode: Mode = "guarded",
) -> list[list[bool]]:
    """`served` at each of ``thresholds`` (the rest of ``policy`` as is), embedding once."""
    qa = [_query(policy, p.a, embedder.name, mode) for p in pairs]
    qb = [_query(policy, p.b, embedder.name, mode) for p in pairs]
    # One request's texts a call, as the worker embeds them: the int8 model quantises its
    # activations per call and pads to the longest text, so a batch of many pairs would give
    # slightly other vectors than production.
    vectors = [embedder.embed(q.embed_texts) for q in qa + qb]
    va, vb = [v[0] for v in vectors[: len(pairs)]], [v[0] for v in vectors[len(pairs) :]]
    ctx_vecs = {q.embed_context: v[1] for q, v in zip(qa + qb, vectors, strict=True) if len(v) > 1}
    scores = [float(np.dot(x, y)) for x, y in zip(va, vb, strict=True)]
    out = []
    for threshold in thresholds:
        at = replace(policy, threshold=threshold)
        hits = []
        for a, b, score in zip(qa, qb, scores, strict=True):
            if a.exact == b.exact:
                hits.append(True)
            elif mode == "cosine":
                hits.append(score >= threshold)
            else:
                candidate = Candidate(
                    question=a.raw_question,
                    context=a.turn.context_text,
                    context_key=a.context,
                    context_vector=ctx_vecs.get(a.embed_context),
                    completion_tokens=1,
                )
                reason = judge(
                    at, b, candidate, score, ctx_vecs.get(b.embed_context), embedder.read_chars
                )
                hits.append(reason is None)
        out.append(hits)
    return out


def _rates(rows: list[tuple[Pair, bool]]) -> dict[str, Any]:
    same = [hit for p, hit in rows if p.same_answer]
    other = [hit for p, hit in rows if not p.same_answer]
    return {
        "served_rate": round(sum(same) / len(same), 4) if same else None,
        "wrong_serve_rate": round(sum(other) / len(other), 4) if other else None,
        "pairs": len(rows),
    }


def _grouped(rows: list[tuple[Pair, bool]], key: Callable[[Pair], str]) -> dict[str, Any]:
    groups: dict[str, list[tuple[Pair, bool]]] = {}
    for row in rows:
        groups.setdefault(key(row[0]), []).append(row)
    return {name: _rates(groups[name]) for name in sorted(groups)}


def report(pairs: list[Pair], hits: list[bool]) -> dict[str, Any]:
    """`served_rate`, `wrong_serve_rate` and the same per category (`by_category`)."""
    rows = list(zip(pairs, hits, strict=True))
    overall = _rates(rows)
    return {
        "served_rate": overall["served_rate"],
        "wrong_serve_rate": overall["wrong_serve_rate"],
        "by_category": _grouped(rows, lambda p: p.category or "-"),
    }


def kind(category: str) -> str:
    """The pair's kind without its language, so English and Chinese traps of one kind add up:
    `en_negation` and `zh_negation` are `negation`, `conv_zh_detail_change` is
    `conv_detail_change`."""
    for prefix, keep in (("conv_en_", "conv_"), ("conv_zh_", "conv_"), ("en_", ""), ("zh_", "")):
        if category.startswith(prefix):
            return keep + category.removeprefix(prefix)
    return category or "-"


@dataclass(frozen=True, slots=True)
class PairSet:
    """One named set (dev, validation, holdout): its files' pairs, in file order."""

    name: str
    files: dict[str, list[Pair]]

    @property
    def pairs(self) -> list[Pair]:
        return [p for pairs in self.files.values() for p in pairs]


def data_dir() -> Path | None:
    """The checkout's ``tests/data``, found beside this package; None when the package was
    installed without the repository's tests (a wheel)."""
    path = Path(__file__).resolve().parents[2] / "tests" / "data"
    return path if path.is_dir() else None


def set_files(data: Path, name: str) -> list[Path]:
    """The JSONL files of set `name` under a ``tests/data`` directory."""
    folders = {
        "dev": data,
        "validation": data / "validation",
        "holdout": data / "validation" / "holdout",
    }
    if name not in folders:
        raise ValueError(f"unknown set {name!r}; known: {', '.join(SET_NAMES)}")
    return sorted(folders[name].glob("*.jsonl"))


def load_set(data: Path, name: str) -> PairSet:
    files = set_files(data, name)
    if not files:
        raise FileNotFoundError(f"set {name!r} has no *.jsonl files under {data}")
    return PairSet(name, {path.name: load_file(path) for path in files})


def set_report(pair_set: PairSet, hits: list[bool]) -> dict[str, Any]:
    """`report` for one set, plus its size and the rates per file and per kind (`by_kind`:
    the categories with their language prefix removed)."""
    pairs = pair_set.pairs
    rows = list(zip(pairs, hits, strict=True))
    by_file: dict[str, Any] = {}
    start = 0
    for file_name, file_pairs in pair_set.files.items():
        by_file[file_name] = _rates(rows[start : start + len(file_pairs)])
        start += len(file_pairs)
    return {
        "pairs": len(pairs),
        **report(pairs, hits),
        "by_kind": _grouped(rows, lambda p: kind(p.category)),
        "by_file": by_file,
    }
