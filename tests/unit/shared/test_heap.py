"""shared/heap.py as the gateway uses it: start-up objects frozen, then first-use ones once."""

from __future__ import annotations

import gc

import pytest

from gateway.state import Gateway
from shared.heap import FIRST_USE_REQUESTS, freeze_startup_objects
from shared.settings import Settings


def test_startup_objects_leave_the_collectors_sight() -> None:
    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # noqa: F841 - alive across the freeze
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() >= before + 1000
    finally:
        gc.unfreeze()


def test_gateway_freezes_first_use_objects_once(monkeypatch: pytest.MonkeyPatch) -> None:
    frozen: list[int] = []
    monkeypatch.setattr("shared.heap.freeze_first_use_objects", lambda: frozen.append(1))
    gw = Gateway(Settings(database_url="sqlite+aiosqlite:///:memory:"))
    for _ in range(FIRST_USE_REQUESTS - 1):
        gw.chat_started()
    assert frozen == []
    for _ in range(3 * FIRST_USE_REQUESTS):
        gw.chat_started()
    assert frozen == [1]
    chats = gw.metrics.registry.get_sample_value("firsttoken_gateway_chats_total")
    assert chats == 4 * FIRST_USE_REQUESTS - 1
