"""The Celery message the gateway builds without importing the workers."""

from __future__ import annotations

import base64
import json
import re

import pytest
from kombu.transport.virtual.base import Channel
from kombu.utils import json as kombu_json

from shared.keys import Keys
from shared.tasks import parse_task_message, task_message
from shared.timing import stage_timings


def test_envelope_is_a_celery_protocol_2_message() -> None:
    """Headers name the task and id; the body is [args, kwargs, embed] as plain JSON."""
    env = json.loads(
        task_message("firsttoken.chat", {"job": {"a": 1}}, queue="chat", task_id="abc")
    )
    assert env["headers"]["task"] == "firsttoken.chat" and env["headers"]["id"] == "abc"
    assert env["properties"]["delivery_info"]["routing_key"] == "chat"
    assert "body_encoding" not in env["properties"]
    body = Channel.decode_body(None, env["body"], None)  # type: ignore[arg-type]
    assert json.loads(body) == [
        [],
        {"job": {"a": 1}},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]


def test_every_key_carries_the_prefix() -> None:
    """Queues, channels and keys all live under one prefix."""
    k = Keys("p1")
    names = [
        k.queue_list("chat"),
        k.job_channel("j"),
        k.replay_stream("j"),
        k.cancel_flag("j"),
        k.cancel_channel,
        k.api_key("h"),
        k.worker_heartbeats("chat"),
        k.job_owner("j"),
    ]
    assert all(n.startswith("p1:") for n in names)


def test_stage_timings_skip_unknown_points_and_never_go_negative() -> None:
    """Durations are in ms; a stage with a missing point is left out."""
    t = stage_timings({"received": 1.0, "enqueued": 1.001, "worker_start": 1.0005})
    assert t == {"accept_ms": 1.0, "queue_ms": 0.0}


def test_parse_reads_back_what_task_message_wrote() -> None:
    raw = task_message("firsttoken.chat", {"job": {"a": 1}}, queue="chat", task_id="abc")
    call = parse_task_message(raw.encode())
    assert (call.name, call.task_id, call.args, call.kwargs) == (
        "firsttoken.chat",
        "abc",
        [],
        {"job": {"a": 1}},
    )


def test_non_ascii_text_reads_back_the_same_for_kombu_and_for_the_consumer() -> None:
    """Bodies carry non-ASCII as UTF-8 (no \\u escapes): kombu's JSON decoder (the Celery pool)
    and parse_task_message (the chat queue's reader) both read the text back unchanged."""
    text = "Grüße aus 北京 🙂"
    raw = task_message("firsttoken.chat", {"job": {"q": text}}, queue="chat", task_id="abc")
    assert text in raw
    body = Channel.decode_body(None, json.loads(raw)["body"], None)  # type: ignore[arg-type]
    assert kombu_json.loads(body)[1] == {"job": {"q": text}}
    assert parse_task_message(raw.encode()).kwargs == {"job": {"q": text}}


def test_parse_reads_a_base64_body_as_celerys_producer_writes_it() -> None:
    env = json.loads(task_message("t", {"x": [1, "ü"]}, queue="chat", task_id="i"))
    env["body"] = base64.b64encode(env["body"].encode()).decode()
    env["properties"]["body_encoding"] = "base64"
    assert parse_task_message(json.dumps(env)).kwargs == {"x": [1, "ü"]}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"not json", "not a Celery protocol-2 JSON task message"),
        (b'{"body": "[[], {}, {}]"}', "missing 'headers'"),
        (b'{"headers": {"task": "t", "id": "i"}, "body": "[1]"}', "not a Celery"),
        (
            b'{"headers": {"task": "t", "id": "i"}, "body": "x", '
            b'"content-type": "application/x-python-serialize"}',
            "only JSON",
        ),
    ],
)
def test_parse_says_what_is_wrong(raw: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_task_message(raw)


def test_priority_lists_follow_kombus_order() -> None:
    from workers.chat.consumer import priority_lists

    assert priority_lists("ft:celery:chat") == [
        "ft:celery:chat",
        "ft:celery:chat\x06\x163",
        "ft:celery:chat\x06\x166",
        "ft:celery:chat\x06\x169",
    ]
