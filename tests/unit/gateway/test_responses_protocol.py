"""The Responses door's pure shapes (gateway/responses_protocol.py): what is accepted, what is
refused by name, the response object and the typed events as the official SDK reads them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.openai_protocol import error_reply
from gateway.openai_request import InvalidParameter
from gateway.responses_protocol import (
    EventEncoder,
    ResponseHead,
    chat_frame,
    load_record,
    parse_responses_request,
    response_object,
    status_of,
    stored_record,
)


def parse(**body: Any) -> Any:
    return parse_responses_request(
        orjson.dumps({"model": "m", "input": "hi", **body}), max_bytes=1 << 16, max_messages=4
    )


def refused(**body: Any) -> InvalidParameter:
    with pytest.raises(InvalidParameter) as info:
        parse(**body)
    return info.value


def test_input_string_items_and_instructions() -> None:
    assert [(m.role, m.content) for m in parse().messages] == [("user", "hi")]
    parsed = parse(
        instructions="be brief",
        input=[
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "b", "annotations": []}],
            },
            {"role": "user", "content": "c"},
        ],
    )
    assert [(m.role, m.content) for m in parsed.messages] == [
        ("system", "be brief"),
        ("system", "rules"),
        ("user", "a"),
        ("assistant", "b"),
        ("user", "c"),
    ]
    assert parsed.store and not parsed.stream


def test_end_user_metadata_and_the_frame() -> None:
    parsed = parse(user="u1", safety_identifier="s1", metadata={"k": "v"}, max_output_tokens=5)
    frame = chat_frame(parsed, chat_id="c", conversation_id="new", cache=False)
    assert frame.user == "s1" and frame.tags == {"k": "v"} and frame.max_tokens == 5
    assert frame.conversation_id == "new" and frame.cache is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"top_p": 0.1}, "top_p"),
        ({"text": {"format": {"type": "json_object"}}}, "text"),
        ({"colour": "red"}, "colour"),
        ({"previous_response_id": "resp_1", "store": False}, "store"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": "x"}] * 5}, "input"),
        ({"input": []}, "input"),
    ],
)
def test_refused_by_name(body: dict[str, Any], param: str) -> None:
    assert refused(**body).param == param


@pytest.mark.parametrize("kind", ["input_image", "input_file", "input_audio"])
def test_non_text_content_is_refused_naming_its_type(kind: str) -> None:
    exc = refused(input=[{"role": "user", "content": [{"type": kind}]}])
    assert kind in exc.message and exc.param == "input[0].content"


def test_the_sdks_no_op_values_are_accepted() -> None:
    parsed = parse(
        tools=[],
        include=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        truncation="disabled",
        text={"format": {"type": "text"}},
        reasoning=None,
        top_p=None,
    )
    assert parsed.messages[-1].content == "hi"


def _head(**body: Any) -> ResponseHead:
    return ResponseHead("resp_1", 1, "m", parse(**body), "msg_1")


DONE = {
    "type": "done",
    "model": "small",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "cached_prompt_tokens": 3},
}


def test_response_object_reads_in_the_sdk() -> None:
    obj = response_object(_head(instructions="x"), status_of(DONE), text="hey", done=DONE)
    response = Response.model_validate(obj)
    assert response.output_text == "hey" and response.model == "small"
    assert response.usage is not None and response.usage.total_tokens == 9
    assert response.usage.input_tokens_details.cached_tokens == 3
    cut = {**DONE, "finish_reason": "length"}
    assert response_object(_head(), status_of(cut), text="h", done=cut)["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    failed = response_object(_head(), "failed", error=error_reply("rate_limited", "slow"))
    assert Response.model_validate(failed).error.code == "rate_limit_exceeded"  # type: ignore[union-attr]


def test_events_in_order_numbered_and_typed() -> None:
    head = _head()
    events = EventEncoder(head)
    body = events.start() + events.delta("he") + events.delta('y"\n')
    body += events.finish(response_object(head, "completed", text='hey"\n', done=DONE))
    body += events.failed(error_reply("engine_error", "x"), response_object(head, "failed"))
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    kinds = []
    for i, raw in enumerate(b for b in body.split(b"\n\n") if b):
        name, data = raw.split(b"\n", 1)
        event = adapter.validate_python(orjson.loads(data.removeprefix(b"data: ")))
        assert name == b"event: " + event.type.encode() and event.sequence_number == i
        kinds.append(event.type)
        if event.type == "response.output_text.done":
            assert event.text == 'hey"\n'
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
        "error",
        "response.failed",
    ]


def test_stored_record_round_trip() -> None:
    obj = response_object(_head(), "completed", text="a", done=DONE)
    record = load_record(stored_record("t1", "conv", obj))
    assert record is not None and record.tenant_id == "t1" and record.conversation_id == "conv"
    assert record.response == obj
    assert load_record(None) is None and load_record(b"not json") is None
