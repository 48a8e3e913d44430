"""The Responses API door (`/v1/responses`, issue 44) against a real stack (gateway, Celery chat
and bulk workers, sim-server, Redis, PostgreSQL), with the official `openai` SDK and the OpenAI
Agents SDK as clients: typed events in order, whole responses, instructions, a conversation
continued by previous_response_id whose history the server keeps (and bounds), retrieve and
delete, every error status, and disconnect -> engine abort."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from firsttoken.keyscli import create_key
from shared.settings import load_settings
from tests.integration.conftest import Services, Stack, losing_stack, make_stack

# The Chat Completions door's SDK clients (no retries; the sync ones closed after each test:
# the fixture is imported to apply here too).
from tests.integration.test_openai_door import (  # noqa: F401
    _close_sync_clients,
    async_client,
    model_of,
    refused_503_then_504,
    sync_client,
)

pytestmark = pytest.mark.integration

ABORTED = "firsttoken_sim_requests_aborted_total"
# A long conversation sends its last RECENT messages once its history passes WINDOW_TOKENS.
WINDOW_TOKENS = 100
RECENT = 2


@pytest.fixture(scope="module")
def rstack(services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The door's stack, with a small conversation window so that bounding shows quickly."""
    with make_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("logs44"),
        context_summary_after_tokens=str(WINDOW_TOKENS),
        context_recent_messages=str(RECENT),
    ) as s:
        s.wait_ready()
        yield s


async def other_tenant_key(stack: Stack, **limits: int) -> str:
    settings = load_settings(
        database_url=stack.services.database_url,
        redis_url=stack.services.redis_url,
        redis_prefix=stack.prefix,
    )
    # On a loop of its own: the database engine lives and dies with it.
    created = await asyncio.to_thread(
        asyncio.run, create_key(settings, f"r44-{uuid.uuid4().hex[:6]}", **limits)
    )
    return created.key


async def row_of(stack: Stack, request_id: str) -> Any:
    from sqlalchemy import select

    from shared.db.models import UsageEvent
    from shared.db.session import make_engine, make_sessionmaker

    engine = make_engine(stack.services.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            stmt = select(UsageEvent).where(UsageEvent.request_id == request_id)
            return await session.scalar(stmt)
    finally:
        await engine.dispose()


EVENT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    # "response.output_text.delta" ...
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_streamed_events_in_order_sync(rstack: Stack) -> None:
    client = sync_client(rstack)
    events = list(
        client.responses.create(
            model=model_of(rstack), input="responses door, streamed", stream=True
        )
    )
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas, kinds
    assert [k for k in kinds if k != "response.output_text.delta"][:-1] == EVENT_ORDER
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    final = events[-1].response  # type: ignore[union-attr]
    assert final.id.startswith("resp_") and final.output_text == text
    assert events[4 + len(deltas)].text == text  # type: ignore[union-attr]
    usage = final.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0


async def test_whole_and_streamed_async_with_instructions(rstack: Stack) -> None:
    client = async_client(rstack)
    model = model_of(rstack)
    plain = await client.responses.create(model=model, input="tell me about the door")
    told = await client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "tell me about the door"}]}
        ],
        instructions="Answer like a pirate. " * 20,
        max_output_tokens=8,
        metadata={"suite": "issue44"},
        user="end-user-44",
    )
    assert plain.object == "response" and plain.output_text
    assert told.instructions and told.metadata == {"suite": "issue44"}
    assert told.status in ("completed", "incomplete") and told.output_text
    assert told.usage is not None and plain.usage is not None
    # The instructions are the turn's system prompt: the prompt is longer by them.
    assert told.usage.input_tokens > plain.usage.input_tokens + 20
    assert told.usage.output_tokens <= 8
    # The usage row (written by the bulk worker) carries metadata and user, as the Chat
    # Completions door's does; its request id is the job's (the output message's id).
    job_id = told.output[0].id.removeprefix("msg_")
    row = None
    for _ in range(100):
        row = await row_of(rstack, job_id)
        if row is not None:
            break
        await asyncio.sleep(0.1)
    assert row is not None, "no usage row"
    assert row.tags == {"suite": "issue44"} and row.end_user == "end-user-44"
    assert row.door == "responses"  # the door the chat came in by
    stream = await client.responses.create(model=model, input="async stream", stream=True)
    kinds = [e.type async for e in stream]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    await client.close()


async def test_three_turns_by_previous_response_id_then_retrieve_and_delete(
    rstack: Stack,
) -> None:
    client = async_client(rstack)
    model = model_of(rstack)
    first = await client.responses.create(model=model, input="My name is Ada. Remember it.")
    second = await client.responses.create(
        model=model, input="What is my name?", previous_response_id=first.id
    )
    third = await client.responses.create(
        model=model, input="And again?", previous_response_id=second.id, stream=True
    )
    events = [e async for e in third]
    done = events[-1].response  # type: ignore[union-attr]
    inputs = [r.usage.input_tokens for r in (first, second, done)]  # type: ignore[union-attr]
    # Each turn sent only its new input; the server added the earlier turns.
    assert inputs[0] < inputs[1] < inputs[2], inputs
    assert second.previous_response_id == first.id and done.previous_response_id == second.id

    got = await client.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    assert got.usage is not None and got.usage.input_tokens == inputs[1]

    # Only the latest response of a conversation continues it (no forks).
    with pytest.raises(openai.BadRequestError) as fork:
        await client.responses.create(model=model, input="fork", previous_response_id=first.id)
    assert fork.value.param == "previous_response_id"

    await client.responses.delete(done.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(done.id)
    with pytest.raises(openai.NotFoundError) as gone:
        await client.responses.create(model=model, input="x", previous_response_id=done.id)
    assert gone.value.status_code == 404 and gone.value.param == "previous_response_id"
    await client.close()


async def test_a_stored_response_served_from_the_cache_is_continued(rstack: Stack) -> None:
    """A stored response's turns may come from the cache (issue 45): the turn served is its
    conversation's, so it is continued as any other, and a follow-up after the same turns is
    served too."""
    client = async_client(rstack)
    model = model_of(rstack)
    opening = f"My ticket is {uuid.uuid4().hex[:8]}. Remember it."
    first = await client.responses.create(model=model, input=opening)
    await asyncio.sleep(2.0)  # its entry written after the response, then synced (1 s)
    again = await client.responses.create(model=model, input=opening)
    assert (again.model_extra or {})["x_firsttoken"]["cached"] is True
    assert again.output_text == first.output_text
    follow = await client.responses.create(
        model=model, input="What is my ticket?", previous_response_id=first.id
    )
    await asyncio.sleep(2.0)
    served = await client.responses.create(
        model=model, input="What is my ticket?", previous_response_id=again.id
    )
    assert (served.model_extra or {})["x_firsttoken"]["cached"] is True
    assert served.output_text == follow.output_text
    assert served.previous_response_id == again.id
    await client.close()


async def test_long_conversation_is_bounded_by_the_window(rstack: Stack) -> None:
    client = async_client(rstack)
    model = model_of(rstack)
    text = "We talked about the rollout plan and the budget for the migration. " * 3
    previous = None
    inputs = []
    for i in range(7):
        answer = await client.responses.create(
            model=model, input=f"{text} turn {i}", previous_response_id=previous,
            max_output_tokens=8,
        )  # fmt: skip
        assert answer.usage is not None
        inputs.append(answer.usage.input_tokens)
        previous = answer.id
    # Turn 1 sends turn 0 as history; from turn 2 the history is past WINDOW_TOKENS and only
    # the last RECENT messages go (there is no summarize worker here to add a summary): the
    # prompt stops growing by a turn each time (the whole history would be ~6 turns longer).
    turn = inputs[1] - inputs[0]
    assert turn > 20, inputs
    assert max(inputs[2:]) - inputs[1] < turn / 2, inputs
    await client.close()


async def test_foreign_tenant_and_unknown_ids_are_404(rstack: Stack) -> None:
    client = async_client(rstack)
    model = model_of(rstack)
    mine = await client.responses.create(model=model, input="a private answer")
    other = async_client(rstack, key=await other_tenant_key(rstack))
    for call in (
        other.responses.retrieve(mine.id),
        other.responses.delete(mine.id),
        other.responses.create(model=model, input="x", previous_response_id=mine.id),
        client.responses.retrieve("resp_nosuchresponse"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            await call
        assert info.value.status_code == 404
        assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert (await client.responses.retrieve(mine.id)).id == mine.id  # not deleted by the other
    await client.close()
    await other.close()


def test_errors_in_openai_shape(rstack: Stack) -> None:
    model = model_of(rstack)
    client = sync_client(rstack)
    with pytest.raises(openai.AuthenticationError) as info:
        sync_client(rstack, key="ft-not-a-key").responses.create(model=model, input="x")
    assert info.value.status_code == 401
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(model="no-such-model", input="x")
    assert nf.value.code == "model_not_found"
    refused: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"top_p": 0.5}, "top_p"),
        ({"previous_response_id": "resp_x", "conversation": "conv_1"}, "conversation"),
    ]
    for params, name in refused:
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model=model, input="x", **params)
        assert bad.value.param == name and name in bad.value.message, params
    for item in (
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]},
        {"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]},
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model=model, input=[item])  # type: ignore[list-item]
        kind = item["content"][0]["type"]  # type: ignore[index]
        assert kind in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(
            model=model, input=[{"type": "function_call_output", "call_id": "c", "output": "o"}]
        )
    assert "function_call_output" in bad.value.message
    # The SDK's no-op values (what the Agents SDK sends) are accepted.
    ok = client.responses.create(
        model=model, input="x", tools=[], include=[], truncation="disabled", max_output_tokens=3
    )
    assert ok.output_text
    resp = httpx.post(
        f"{rstack.http}/v1/responses",
        content=b'{"model": "m", "input": [',
        headers={"authorization": f"Bearer {rstack.api_key}"},
    )
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


async def test_rate_limited_is_429_with_retry_after(rstack: Stack) -> None:
    client = async_client(rstack, key=await other_tenant_key(rstack, rpm=1))
    model = model_of(rstack)
    await client.responses.create(model=model, input="one", max_output_tokens=2)
    with pytest.raises(openai.RateLimitError) as info:
        await client.responses.create(model=model, input="two", max_output_tokens=2)
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert info.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    await client.close()


async def test_client_disconnect_aborts_the_engine_request(rstack: Stack) -> None:
    aborted = rstack.sim_metric(ABORTED)
    client = async_client(rstack)
    stream = await client.responses.create(
        model=model_of(rstack), input="stream then vanish", stream=True, max_output_tokens=32
    )
    async for event in stream:
        if event.type == "response.output_text.delta":
            break  # the engine is generating
    await stream.close()
    wait = time.monotonic() + 5
    while rstack.sim_metric(ABORTED) <= aborted:
        assert time.monotonic() < wait, "the engine never saw the abort"
        await asyncio.sleep(0.05)
    await client.close()


async def test_agents_sdk_runs_an_agent_through_the_door(rstack: Stack) -> None:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)  # nothing outside this machine can be reached
    client = async_client(rstack)
    model = OpenAIResponsesModel(model=model_of(rstack), openai_client=client)
    agent = Agent(name="helper", instructions="You answer briefly.", model=model)
    result = await Runner.run(agent, "What is firsttoken?")
    assert isinstance(result.final_output, str) and result.final_output
    assert result.last_response_id and result.last_response_id.startswith("resp_")
    # The run's response was stored: the agent's next turn can continue it server-side.
    again = await Runner.run(
        agent, "And in one word?", previous_response_id=result.last_response_id
    )
    assert again.final_output
    streamed = Runner.run_streamed(agent, "Stream it.")
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output
    await client.close()


async def test_worker_loss_is_a_failed_response(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """A worker killed mid-answer: the `error` and `response.failed` events; then no worker:
    503 with Retry-After; a worker that looks alive but takes nothing: 504 after the queue
    deadline (the SDK's status codes, as on the Chat Completions door)."""
    with losing_stack(services, migrated, tmp_path, queue_deadline_s="1.5") as stack:
        client = async_client(stack)
        stream = await client.responses.create(
            model=model_of(stack), input="long answer", stream=True, max_output_tokens=64
        )
        kinds = []
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta" and len(kinds) == 5:
                stack.procs["chat0"].kill()
            if event.type == "error":
                assert event.code == "engine_error"  # type: ignore[union-attr]
            if event.type == "response.failed":
                assert event.response.status == "failed"  # type: ignore[union-attr]
                assert event.response.error is not None  # type: ignore[union-attr]
        assert kinds[-2:] == ["error", "response.failed"], kinds

        async def ask(text: str, stream: bool) -> Any:
            return await client.responses.create(model=model_of(stack), input=text, stream=stream)

        await refused_503_then_504(stack, ask)
        await client.close()
