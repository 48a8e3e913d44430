"""A follow-up is looked up only among entries after the very same earlier turns (issue 45)."""

from __future__ import annotations

from dataclasses import replace

from shared.protocol import Message
from workers.cache.normalize import _digest
from workers.cache.policy import Policy, Query

DEFAULT = Policy()


def _query(history: list[tuple[str, str]], question: str, policy: Policy = DEFAULT) -> Query:
    messages = [Message(role="system", content="Be brief.")]
    messages += [Message.model_validate({"role": r, "content": c}) for r, c in history]
    messages.append(Message(role="user", content=question))
    return Query(
        policy, tenant="t", model="m", embedder="e", messages=messages, max_tokens=8,
        temperature=None,
    )  # fmt: skip


ORDER = [("user", "I ordered a blue jacket, order 48213."), ("assistant", "Found 48213.")]
OTHER = [("user", "I ordered running shoes, order 77120."), ("assistant", "Found 77120.")]


def test_follow_ups_share_a_partition_only_after_the_same_earlier_turns() -> None:
    same = _query(ORDER, "Can you cancel it?").partition
    # The exact tier's normalisation: case, spacing and trailing punctuation do not count.
    alike = [("user", "i ordered a  BLUE jacket, order 48213"), ("assistant", "found 48213")]
    assert _query(alike, "Could you cancel it?").partition == same
    assert _query(OTHER, "Can you cancel it?").partition != same
    assert _query([], "Can you cancel it?").partition != same
    assert _query(ORDER[:1], "Can you cancel it?").partition != same


def test_a_first_turns_partition_is_what_it_was() -> None:
    """Entries stored before follow-ups had their own partitions stay reachable."""
    assert _query([], "Can you cancel it?").partition == _digest(["p1", "m|e", "be brief"])


def test_with_contexts_compared_by_embedding_follow_ups_search_the_questions_partition() -> None:
    semantic = replace(Policy(), context_threshold=0.9)
    assert (
        _query(ORDER, "Can you cancel it?", semantic).partition
        == _query(OTHER, "Can you cancel it?", semantic).partition
        == _query([], "Can you cancel it?", semantic).partition
    )
