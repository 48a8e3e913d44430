"""workers/retrieval/gather.py: sources that answer from their cache are taken without a task,
so a chat whose sources are all cached passes the retrieval stage without waiting."""

from __future__ import annotations

from typing import Any

import pytest

from workers.retrieval.gather import Query, SourceResult, gather_sources


class Cached:
    """Answers from its cache (or not), and counts fetches."""

    def __init__(self, name: str, hit: tuple[Any] | None, fetched: Any = "fetched") -> None:
        self.name = name
        self.deadline_s = 1.0
        self.hit = hit
        self.fetched = fetched
        self.fetches = 0

    def cached(self, query: Query) -> tuple[Any] | None:
        if self.hit == ("boom",):
            raise RuntimeError("cache broken")
        return self.hit

    async def fetch(self, query: Query) -> Any:
        self.fetches += 1
        return self.fetched


class Plain:
    name = "plain"
    deadline_s = 1.0

    async def fetch(self, query: Query) -> str:
        return "plain"


def _finished_without_waiting(sources: list[Any]) -> dict[str, SourceResult]:
    """Drive gather_sources one step: it must finish in it (no task, no loop pass)."""
    coro = gather_sources(sources, Query("t", "q"))
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    result: dict[str, SourceResult] = done.value.value
    return result


def test_sources_that_all_answer_from_cache_need_no_wait() -> None:
    a, b = Cached("a", ("A",)), Cached("b", (None,))
    results = _finished_without_waiting([a, b])
    assert [(r.name, r.status, r.value) for r in results.values()] == [
        ("a", "ok", "A"),
        ("b", "ok", None),
    ]
    assert a.fetches == b.fetches == 0


async def test_a_miss_or_a_broken_cache_is_fetched_and_the_order_kept() -> None:
    hit, miss, broken = Cached("hit", ("H",)), Cached("miss", None), Cached("broken", ("boom",))
    results = await gather_sources([miss, hit, Plain(), broken], Query("t", "q"))
    assert list(results) == ["miss", "hit", "plain", "broken"]
    assert [r.value for r in results.values()] == ["fetched", "H", "plain", "fetched"]
    assert (hit.fetches, miss.fetches, broken.fetches) == (0, 1, 1)
