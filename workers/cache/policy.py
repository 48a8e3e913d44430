"""The cache's decisions, as plain functions over values: what may be stored, and whether a
similar cached question may answer this one. Used by the worker and by `firsttoken cache eval`,
so the evaluation measures exactly what production serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shared.protocol import Message
from workers.cache.guards import Features, disagreement, features
from workers.cache.normalize import (
    Turn,
    context_key,
    exact_key,
    normalize,
    partition_key,
    split_turn,
)
from workers.cache.verify import MAX_RAISE, shape, verified_score
from workers.cache.verify import NAME as VERIFIER


@dataclass(frozen=True, slots=True)
class Policy:
    threshold: float = 0.92
    # None: the earlier turns of a conversation must be the same (after the exact tier's
    # normalisation) for its last question to be served from another conversation's answer;
    # their hash is part of the partition searched (Query.partition). A number: they may differ
    # if their embeddings are this similar and the guards agree; measured to serve wrong answers
    # (docs/benchmarks.md), so only on request.
    context_threshold: float | None = None
    context_messages: int = 4  # recent earlier messages embedded when context_threshold is set
    max_temperature: float = 0.7
    store_truncated: bool = False
    # "overlap": the threshold is compared with the cosine adjusted by the shape of the edit
    # between the two questions (workers/cache/verify.py); "none": with the cosine.
    verifier: str = "none"

    @property
    def min_score(self) -> float:
        """The least cosine a candidate may have to be served at all: the verifier can raise a
        score, so candidates are fetched from that far below the threshold."""
        return self.threshold - (MAX_RAISE if self.verifier == VERIFIER else 0.0)


def storable(
    policy: Policy, *, status: str, finish_reason: str, temperature: float | None, answer: str
) -> bool:
    """Only clean, complete, low-temperature answers are worth serving to someone else."""
    if status != "ok" or not answer.strip():
        return False
    if finish_reason != "stop" and not (policy.store_truncated and finish_reason == "length"):
        return False
    return temperature is None or temperature <= policy.max_temperature


def servable(policy: Policy, temperature: float | None) -> bool:
    """A client asking for high-temperature sampling wants variety, not a replay."""
    return temperature is None or temperature <= policy.max_temperature


class Query:
    """One request, split and hashed once; features computed on first use."""

    def __init__(
        self,
        policy: Policy,
        *,
        tenant: str,
        model: str,
        embedder: str,
        messages: Sequence[Message],
        max_tokens: int,
        temperature: float | None,
    ) -> None:
        self.tenant = tenant
        self.turn: Turn = split_turn(messages)
        self._embedded_context = (
            self.turn.context[-policy.context_messages :]
            if policy.context_threshold is not None and policy.context_messages > 0
            else ()
        )
        self.raw_question = next((m.content for m in reversed(messages) if m.role == "user"), "")
        self.exact = exact_key(
            tenant=tenant,
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        self.context = context_key(self.turn.context)
        # A follow-up searches only the entries after the very same earlier turns (unless
        # contexts are compared by embedding): a common follow-up ("Can you cancel it?") of
        # many conversations never crowds its own conversation's entry out of the candidates.
        same_history = policy.context_threshold is None
        self.partition = partition_key(
            f"{model}|{embedder}", self.turn.system, self.context if same_history else ""
        )
        self.max_tokens = max_tokens

    @property
    def embed_question(self) -> str:
        return self.turn.question

    @property
    def embed_context(self) -> str:
        """The earlier turns' text to embed; "" unless contexts are compared semantically.
        Most recent first: when the embedder truncates, the oldest turns go."""
        return "\n".join(content for _, content in reversed(self._embedded_context))

    @property
    def embed_texts(self) -> list[str]:
        """What the embedder gets for this request: the question, then the context if any."""
        return [self.embed_question] + ([self.embed_context] if self.embed_context else [])

    @cached_property
    def question_features(self) -> Features:
        return features(self.raw_question)

    @cached_property
    def context_features(self) -> Features:
        return features(self.turn.context_text)


def differs_where_read(a: str, b: str, read_chars: Callable[[str], int]) -> bool:
    """Whether everything that differs between two embedded texts lies in the part the model
    read of each. A model that truncates (MiniLM reads 128 tokens) scores two long texts alike
    in their first words as one text: a pasted report whose last lines name another cause.
    Beyond what it read, the two must be the same text."""
    if a == b:
        return True
    same_tail = _common_suffix(a, b)
    return len(a) - same_tail <= read_chars(a) and len(b) - same_tail <= read_chars(b)


def _common_suffix(a: str, b: str) -> int:
    """The length of the longest text both end with (a binary search of slice comparisons:
    a 100k-character question costs microseconds, not a Python loop over it)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the judge needs of a cached entry."""

    question: str  # raw, as its user wrote it
    context: str  # the earlier turns' normalised text, "" when none
    context_key: str
    context_vector: np.ndarray | None
    completion_tokens: int


def scored(policy: Policy, query: Query, candidate: Candidate, score: float) -> float:
    """The score ``judge`` compares with the threshold: the cosine, adjusted by the verifier
    for the shape of the edit (the bucket a verdict is counted in, workers/cache/online.py)."""
    if policy.verifier == VERIFIER and score >= policy.min_score:
        return verified_score(score, shape(candidate.question, query.raw_question))
    return score


def judge(
    policy: Policy,
    query: Query,
    candidate: Candidate,
    score: float,
    context_vector: np.ndarray | None,
    read_chars: Callable[[str], int] = len,
) -> str | None:
    """None when ``candidate`` may answer ``query``; else the reason it may not.

    ``read_chars``: how much of a question the embedding model reads (``Embedder.read_chars``;
    ``len`` for a model that reads every text whole)."""
    reworded = False
    if policy.verifier == VERIFIER and score >= policy.min_score:
        edit = shape(candidate.question, query.raw_question)
        score = verified_score(score, edit)
        reworded = edit.reworded
    if score < policy.threshold:
        return "similarity"
    if not differs_where_read(query.embed_question, normalize(candidate.question), read_chars):
        return "unread"
    if candidate.completion_tokens > query.max_tokens:
        return "max_tokens"  # the stored answer is longer than this client allows
    if candidate.context_key != query.context:
        if policy.context_threshold is None:
            return "context"
        if not candidate.context or not query.turn.context:
            return "context"
        if candidate.context_vector is None or context_vector is None:
            return "context"
        if float(candidate.context_vector @ context_vector) < policy.context_threshold:
            return "context"
        reason = disagreement(query.context_features, features(candidate.context))
        if reason is not None:
            return f"context_{reason}"
    reason = disagreement(query.question_features, features(candidate.question), reworded=reworded)
    return None if reason is None else reason
