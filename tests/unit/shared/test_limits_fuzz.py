"""Fuzzing the protocol parser: thousands of random and malformed frames, never a crash."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.errors import InvalidRequest, error_frame
from shared.protocol import dumps, frame_id, parse_client_frame

NO_SURROGATES = st.characters(blacklist_categories=("Cs",))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "bot", ""]), "content": SCALARS}
    ),
    max_size=4,
)
FRAMES = st.fixed_dictionaries(
    {"type": st.sampled_from(["chat", "cancel", "resume", "ping", "launch", 7, None])},
    optional={
        "id": st.text(max_size=140) | JSON_VALUES,
        "messages": MESSAGES | JSON_VALUES,
        "max_tokens": st.integers(-3, 10_000) | JSON_VALUES,
        "temperature": st.floats() | JSON_VALUES,
        "cache": JSON_VALUES,
        "model": JSON_VALUES,
        "job_id": st.text(max_size=70) | JSON_VALUES,
        "after_seq": st.integers(-5, 5) | JSON_VALUES,
        "extra": JSON_VALUES,
    },
)


def _mangle(text: str, cut: int) -> str:
    return text[: max(0, len(text) - cut)]


# What reaches the parser: valid-looking frames, truncated ones, random text and random bytes.
RAW = st.one_of(
    FRAMES.map(json.dumps),
    FRAMES.map(lambda f: json.dumps(f, ensure_ascii=False)),
    st.tuples(FRAMES.map(json.dumps), st.integers(1, 20)).map(lambda t: _mangle(*t)),
    st.text(max_size=300),
    st.text(NO_SURROGATES, max_size=300),
    st.binary(max_size=300),
    st.sampled_from(["[" * 50_000, '{"a":' * 30_000, "1e999999", "9" * 5000, '"\\ud800"']),
)


def check_one(raw: str | bytes) -> None:
    try:
        frame = parse_client_frame(raw, max_bytes=64 * 1024, max_messages=16)
    except InvalidRequest as exc:
        reply = dumps(error_frame(frame_id(raw), exc))
        reply.encode()  # whatever the input, the error frame can be sent
        return
    dumps(frame.model_dump()).encode()  # an accepted frame holds only sendable text


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RAW)
def test_parser_never_crashes(raw: str | bytes) -> None:
    """Any input: a typed frame or InvalidRequest, and whatever goes back is valid UTF-8."""
    check_one(raw)
