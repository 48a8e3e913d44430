"""The simulator's prefix cache (issue 34): which prompt tokens are cached, and what the
simulated engine reports and charges for them."""

from __future__ import annotations

import asyncio

from shared.protocol import Message
from workers.engines.base import Delta, EngineRequest
from workers.engines.prefixcache import (
    BLOCK_TOKENS,
    PrefixCache,
    block_hashes,
    prefilled_tokens,
    prompt_token_words,
)
from workers.engines.sim import SimEngine, SimOptions, count_prompt_tokens


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_the_stand_in_tokens_are_as_many_as_the_simulator_counts() -> None:
    messages = [Message(role="system", content="be brief"), Message(role="user", content="a b c")]
    assert len(prompt_token_words(messages)) == count_prompt_tokens(messages)


def test_only_full_blocks_are_hashed_and_each_depends_on_all_before_it() -> None:
    assert len(block_hashes(words(2 * BLOCK_TOKENS + 5))) == 2
    same_second_block = words(BLOCK_TOKENS, "a") + words(BLOCK_TOKENS, "z")
    other_first_block = words(BLOCK_TOKENS, "b") + words(BLOCK_TOKENS, "z")
    assert block_hashes(same_second_block)[1] != block_hashes(other_first_block)[1]


def test_a_prompt_sharing_a_prefix_finds_its_leading_blocks_cached() -> None:
    cache = PrefixCache(10_000)
    draft = [*words(100), "typing"]
    cache.insert(block_hashes(draft))
    sent = [*words(100), "typing", "done", "now"]
    assert cache.cached_tokens(block_hashes(sent), len(sent)) == 96  # 6 whole blocks
    assert cache.cached_tokens(block_hashes(words(100, "x")), 100) == 0


def test_a_prompt_found_whole_still_computes_its_last_block() -> None:
    cache = PrefixCache(10_000)
    prompt = words(4 * BLOCK_TOKENS)
    cache.insert(block_hashes(prompt))
    assert cache.cached_tokens(block_hashes(prompt), len(prompt)) == 3 * BLOCK_TOKENS


def test_the_least_recently_used_blocks_go_first_when_full() -> None:
    cache = PrefixCache(4 * BLOCK_TOKENS)
    old, new = words(3 * BLOCK_TOKENS, "o"), words(3 * BLOCK_TOKENS, "n")
    cache.insert(block_hashes(old))
    cache.insert(block_hashes(new))
    assert len(cache) == 4
    probe = [*old, "x"]
    assert cache.cached_tokens(block_hashes(probe), len(probe)) == 0  # its first block went
    probe = [*new, "x"]
    assert cache.cached_tokens(block_hashes(probe), len(probe)) == 3 * BLOCK_TOKENS


def test_a_cache_of_zero_tokens_holds_nothing() -> None:
    cache = PrefixCache(0)
    cache.insert(block_hashes(words(64)))
    assert len(cache) == 0


def test_a_prefill_stopped_midway_has_done_the_tokens_its_time_allowed() -> None:
    assert prefilled_tokens(50.0, 1000, 0.1) == 500
    assert prefilled_tokens(500.0, 1000, 0.1) == 1000  # never more than the prompt
    assert prefilled_tokens(-1.0, 1000, 0.1) == 0
    assert prefilled_tokens(50.0, 1000, 0.0) == 0  # no cost modelled: no progress either


def request(text: str, max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(
        messages=[Message(role="user", content=text)], model="sim", max_tokens=max_tokens
    )


async def last(engine: SimEngine, req: EngineRequest, request_id: str) -> Delta:
    deltas = [d async for d in engine.stream(req, request_id=request_id)]
    return deltas[-1]


async def test_the_engine_reports_the_cached_prefix_a_one_token_prefill_left() -> None:
    engine = SimEngine(SimOptions(ttft_ms=0, itl_ms=0, prefix_cache_tokens=10_000))
    history = " ".join(words(200))
    first = await last(engine, request(history + " what is", max_tokens=1), "draft")
    assert first.cached_prompt_tokens == 0
    sent = await last(engine, request(history + " what is it"), "chat")
    assert sent.prompt_tokens == 207
    assert sent.cached_prompt_tokens == 192  # 12 whole blocks of the 200 + framing words


async def test_without_a_cache_the_engine_reports_none() -> None:
    engine = SimEngine(SimOptions(ttft_ms=0, itl_ms=0))
    await last(engine, request("a b c"), "one")
    assert (await last(engine, request("a b c"), "two")).cached_prompt_tokens is None


async def test_an_aborted_prefill_caches_nothing() -> None:
    engine = SimEngine(SimOptions(ttft_ms=10_000, itl_ms=0, prefix_cache_tokens=10_000))
    stream = engine.stream(request(" ".join(words(64))), request_id="slow")
    pending = stream.__anext__()
    task = asyncio.ensure_future(pending)
    await asyncio.sleep(0)
    await engine.abort("slow")
    assert (await task).finish_reason == "abort"
    await stream.aclose()
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 0
