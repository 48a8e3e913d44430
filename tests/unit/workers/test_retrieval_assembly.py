"""workers.retrieval.assembly's pure half: source results -> prompt, route, window."""

from __future__ import annotations

import pytest

from shared.errors import InvalidRequest
from shared.modeltable import parse_models
from shared.settings import load_settings
from shared.tasks import ChatJob
from workers import retrieval
from workers.conversation import StoredMessage
from workers.prompt import ContextChunk
from workers.retrieval.gather import SourceResult
from workers.retrieval.sources import ConversationState

MODELS = parse_models(
    [
        {"name": "small", "engine": "sim", "role": "small"},
        {"name": "large", "engine": "sim", "role": "large"},
    ]
)
SETTINGS = load_settings()


def job(
    text: str = "hello", model: str | None = "small", conversation: str | None = None
) -> ChatJob:
    return ChatJob(
        job_id="j1",
        chat_id="c1",
        tenant_id="t1",
        key_id="k1",
        messages=[{"role": "user", "content": text}],  # type: ignore[list-item]
        model=model,
        max_tokens=16,
        conversation_id=conversation,
        received_at=0.0,
        enqueued_at=0.0,
        deadline_at=1e12,
    )


def ok(name: str, value: object) -> SourceResult:
    return SourceResult(name, "ok", 1.0, value)


def test_the_package_is_the_stage_the_chat_calls() -> None:
    for name in ("prepare", "start_background", "settle_background", "after_answer"):
        assert callable(getattr(retrieval, name))
    assert retrieval.BACKGROUND_SOURCES == {"quota"}


def test_kb_chunks_and_history_reach_the_prompt() -> None:
    state = ConversationState(True, None, None, (StoredMessage(1, "user", "earlier question"),))
    results = {
        "conversation": ok("conversation", state),
        "kb": ok("kb", [ContextChunk("kb:7", "the kb says so", 0.9)]),
        "user": SourceResult("user", "timeout", 150.0),
    }
    prepared = retrieval.assemble(SETTINGS, MODELS, job(conversation="conv1"), results)
    text = " ".join(m.content for m in prepared.job.messages)
    assert "the kb says so" in text and "earlier question" in text
    assert prepared.model == "small" and prepared.decision is None
    assert prepared.conversation_ok
    assert "user" in prepared.retrieval["skipped"]
    assert retrieval.done_fields(prepared)["conversation_id"] == "conv1"


def test_auto_routes_and_reports_the_route() -> None:
    prepared = retrieval.assemble(SETTINGS, MODELS, job(model="auto"), {})
    assert prepared.decision is not None and prepared.model in MODELS.names
    assert retrieval.done_fields(prepared)["route"] == prepared.decision.route


def test_a_conversation_read_and_not_found_is_the_clients_error() -> None:
    results = {"conversation": ok("conversation", ConversationState(found=False))}
    with pytest.raises(InvalidRequest, match='conversation_id "new"'):
        retrieval.assemble(SETTINGS, MODELS, job(conversation="nope"), results)


def test_a_failed_conversation_source_goes_on_without_attaching_the_turn() -> None:
    results = {"conversation": SourceResult("conversation", "error", 1.0, error="down")}
    prepared = retrieval.assemble(SETTINGS, MODELS, job(conversation="conv1"), results)
    assert not prepared.conversation_ok
