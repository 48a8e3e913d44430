"""The bench's HTTP doors (firsttoken/bench/sse.py): their request bodies, and their server-sent
events read as the load generator reads them, one network chunk at a time. The events are made
by the gateway's own encoders, so the reader follows the shapes the doors really send."""

from __future__ import annotations

import orjson
import pytest

from firsttoken.bench.interleave import shared_cpu_share
from firsttoken.bench.sse import CHAT, RESPONSES, Door
from firsttoken.bench.stats import RequestResult
from gateway.openai_protocol import ChunkEncoder, error_reply, parse_chat_request, sse_error
from gateway.responses_protocol import (
    EventEncoder,
    ResponseHead,
    parse_responses_request,
    response_object,
    status_of,
)

DONE = {
    "type": "done",
    "usage": {"prompt_tokens": 9, "completion_tokens": 3},
    "timings": {"queue_ms": 0.4, "relay_ms": 0.2},
    "cached": False,
    "finish_reason": "stop",
}


def _read(door: Door, chunks: list[bytes]) -> tuple[RequestResult, list[int]]:
    """Each chunk's complete events as DirectClient.send cuts them: deltas per chunk."""
    result, counts, buf = RequestResult(start_s=0.0), [], b""
    for chunk in chunks:
        buf += chunk
        if b"\n\n" not in buf:
            counts.append(0)
            continue
        events, _, buf = buf.rpartition(b"\n\n")
        counts.append(door.read(events, result))
    return result, counts


def _head(**body: object) -> ResponseHead:
    raw = orjson.dumps({"model": "sim", "input": "hi", "stream": True, **body})
    parsed = parse_responses_request(raw, max_bytes=1 << 20, max_messages=64)
    return ResponseHead("resp_1", 1, "sim", parsed, "msg_1")


def _finish(enc: EventEncoder, head: ResponseHead, done: dict[str, object]) -> bytes:
    text = "".join(enc.texts)
    return enc.finish(response_object(head, status_of(done), text=text, done=done))


def test_responses_first_text_delta_is_the_first_token() -> None:
    head = _head()
    enc = EventEncoder(head)
    # The gateway writes its opening events with the first delta, in one write.
    chunks = [enc.start() + enc.delta("Hel"), enc.delta("lo"), enc.delta(" there")]
    chunks.append(_finish(enc, head, DONE))
    result, counts = _read(RESPONSES, chunks)
    assert counts == [1, 1, 1, 0]
    assert result.tokens == 3 and result.error is None and not result.cached
    assert result.server_timings == {"queue_ms": 0.4, "relay_ms": 0.2}


def test_responses_deltas_across_chunk_boundaries_and_together() -> None:
    head = _head()
    enc = EventEncoder(head)
    whole = enc.start() + enc.delta("a") + enc.delta('"delta":"" event: x') + enc.delta("")
    cut = len(whole) - 20  # the last event split between two reads
    result, counts = _read(RESPONSES, [whole[:cut], whole[cut:] + enc.delta("b")])
    # Text that looks like the markers is JSON-escaped; an empty delta is no token.
    assert counts == [2, 1]
    assert result.error is None


def test_responses_incomplete_answer_is_an_answer() -> None:
    head = _head(max_output_tokens=2)
    enc = EventEncoder(head)
    done = {**DONE, "finish_reason": "length", "usage": {"completion_tokens": 2}, "cached": True}
    result, counts = _read(RESPONSES, [enc.start() + enc.delta("x") + _finish(enc, head, done)])
    assert counts == [1]
    assert result.tokens == 2 and result.cached and result.error is None


def test_responses_failure_after_the_stream_began_is_an_error() -> None:
    head = _head()
    enc = EventEncoder(head)
    reply = error_reply("engine_error", "the engine went away")
    failed = enc.failed(reply, response_object(head, "failed", error=reply))
    result, counts = _read(RESPONSES, [enc.start() + enc.delta("x"), failed])
    assert counts == [1, 0]
    assert result.error == "engine_error" and result.tokens == 0


def test_responses_body_is_one_unstored_turn_the_door_accepts() -> None:
    body = {**RESPONSES.body("sim", "How?", 16), "x_firsttoken": {"cache": False}}
    parsed = parse_responses_request(orjson.dumps(body), max_bytes=1 << 20, max_messages=64)
    assert parsed.stream and not parsed.store and not parsed.cache
    assert parsed.max_output_tokens == 16
    assert [(m.role, m.content) for m in parsed.messages] == [("user", "How?")]
    assert RESPONSES.path == "/responses" and CHAT.path == "/chat/completions"


def test_chat_counts_content_deltas_and_reads_the_final_chunks() -> None:
    enc = ChunkEncoder("chatcmpl-1", 1, "sim")
    chunks = [enc.token("Hel", first=True), enc.token("lo") + enc.token("")]
    chunks.append(enc.final(DONE) + enc.usage(DONE) + b"data: [DONE]\n\n")
    result, counts = _read(CHAT, chunks)
    assert counts == [1, 1, 0]
    assert result.tokens == 3 and result.error is None
    assert result.server_timings == {"queue_ms": 0.4, "relay_ms": 0.2}


def test_chat_counts_spaced_deltas_of_an_engine_without_extras() -> None:
    spaced = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    spaced += b'data: {"choices": [{"delta": {"content": ""}}]}\n\n'
    spaced += b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n'
    result, counts = _read(CHAT, [spaced])
    assert counts == [1] and result.tokens == 1 and result.server_timings == {}


def test_chat_failure_after_the_stream_began_is_an_error() -> None:
    enc = ChunkEncoder("chatcmpl-1", 1, "sim")
    error = sse_error(error_reply("engine_error", "the engine went away"))
    result, counts = _read(CHAT, [enc.token("x", first=True), error])
    assert counts == [1, 0] and result.error == "engine_error"


def test_chat_body_is_what_the_door_accepts() -> None:
    body = {**CHAT.body("sim", "How?", 16), "x_firsttoken": {"cache": False}}
    parsed = parse_chat_request(
        orjson.dumps(body), chat_id="c1", max_bytes=1 << 20, max_messages=64
    )
    assert parsed.stream and parsed.frame.max_tokens == 16


def test_the_responses_door_shares_the_stacks_cpu_in_an_interleaved_run() -> None:
    cpu_s = {"sim": 4.0, "gateway-0": 3.0}
    ok = {"direct": 10, "openai": 10, "responses": 20}
    share = shared_cpu_share(cpu_s, 1.0, ok, "responses")
    # The engine's CPU over every answer; the gateway's over the answers through its doors.
    assert share == {"sim": pytest.approx(2.0), "gateway-0": pytest.approx(2.0)}
