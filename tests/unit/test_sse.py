"""The `openai` engine's server-sent-event reader, on raw network reads."""

from __future__ import annotations

from collections.abc import AsyncIterator

from shared.engines.openai_engine import sse_data


async def _reads(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _data(*chunks: bytes) -> list[bytes]:
    return [d async for d in sse_data(_reads(*chunks))]


async def test_one_event_per_read() -> None:
    assert await _data(b'data: {"a":1}\n\n', b"data: [DONE]\n\n") == [b'{"a":1}', b"[DONE]"]


async def test_lines_split_across_reads_and_several_per_read() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        assert await _data(stream[:cut], stream[cut:]) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]
    assert await _data(*(bytes([b]) for b in stream)) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


async def test_crlf_comments_event_names_and_no_space() -> None:
    stream = b': keep-alive\r\n\r\nevent: message\r\ndata:{"a":1}\r\n\r\n'
    assert await _data(stream) == [b'{"a":1}']


async def test_last_line_without_newline_is_kept() -> None:
    assert await _data(b"data: [DONE]") == [b"[DONE]"]
