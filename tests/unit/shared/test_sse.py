"""The `openai` engine's server-sent-event splitter, on raw network reads."""

from __future__ import annotations

from workers.engines.httpstream import sse_payloads


def _data(*chunks: bytes) -> list[bytes]:
    """Every payload of the reads, the last incomplete line included (as at the response's
    end)."""
    out: list[bytes] = []
    pending = b""
    for chunk in chunks:
        payloads, pending = sse_payloads(pending, chunk)
        out += payloads
    return out + sse_payloads(pending, b"\n")[0]  # the end of the body ends the last line


def test_one_event_per_read() -> None:
    assert _data(b'data: {"a":1}\n\n', b"data: [DONE]\n\n") == [b'{"a":1}', b"[DONE]"]


def test_lines_split_across_reads_and_several_per_read() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        assert _data(stream[:cut], stream[cut:]) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]
    assert _data(*(bytes([b]) for b in stream)) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


def test_crlf_comments_event_names_and_no_space() -> None:
    stream = b': keep-alive\r\n\r\nevent: message\r\ndata:{"a":1}\r\n\r\n'
    assert _data(stream) == [b'{"a":1}']


def test_last_line_without_newline_is_kept() -> None:
    assert _data(b"data: [DONE]") == [b"[DONE]"]


def test_a_read_with_no_complete_line_gives_nothing_yet() -> None:
    assert sse_payloads(b"", b'data: {"a"') == ([], b'data: {"a"')
    assert sse_payloads(b'data: {"a"', b":1}\n") == ([b'{"a":1}'], b"")
