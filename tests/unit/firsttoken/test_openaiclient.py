"""firsttoken/openaiclient.py: the OpenAI base URL from a gateway's address."""

from __future__ import annotations

import pytest

from firsttoken.openaiclient import base_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://127.0.0.1:8000/v1/ws", "http://127.0.0.1:8000/v1"),
        ("wss://chat.example.com/v1/ws", "https://chat.example.com/v1"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("https://gw.example.com:8443/v1", "https://gw.example.com:8443/v1"),
    ],
)
def test_base_url(url: str, expected: str) -> None:
    assert base_url(url) == expected
