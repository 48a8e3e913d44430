"""The semantic cache end to end: real gateway, two chat worker processes, Redis, the ONNX model."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import websockets

from firsttoken.keyscli import create_key
from shared.keys import Keys
from shared.settings import Settings
from tests.integration.conftest import Client, Services, Stack, _migrate_and_key, make_stack
from tests.integration.test_stack import _usage

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cstack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Two chat workers (no bulk worker: usage rows are not under test here)."""
    with make_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("cachelogs"),
        workers=2,
        bulk=False,
        # An engine slower than a lookup, as a real model is (the stack's default 20 ms sim
        # can beat an embedding on a loaded 2-core machine; then the engine answers, by design).
        sim_args=("--ttft-ms", "200", "--itl-ms", "5", "--max-tokens", "32"),
        cache_max_temperature="0.5",
        # The risk these mechanisms were written at (threshold 0.73, the old default): the
        # shipped 1% (0.97, held out of sample) serves near repeats only, and these tests are
        # about what the cache does with a hit, not about where the threshold lies.
        cache_max_error_rate="0.02",
        # The default frame limit, not the tests' 64 KiB, and a model with room for it: a
        # question near max_message_chars (100,000 characters) must reach the cache.
        max_frame_bytes=str(1 << 20),
        prompt_budget_tokens="65536",
    ) as s:
        s.wait_ready()
        yield s


async def _client(stack: Stack, key: str | None = None) -> Client:
    ws = await websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {key or stack.api_key}"}
    )
    return Client(ws)


async def _ask(
    client: Client, chat_id: str, messages: str | list[dict[str, str]], **extra: Any
) -> tuple[str, dict[str, Any]]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    await client.send({"type": "chat", "id": chat_id, "messages": messages, **extra})
    tokens, last = await client.until_end(chat_id, timeout=30)
    assert last["type"] == "done", last
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    return "".join(t["text"] for t in tokens), last


async def _error(client: Client, chat_id: str, text: str) -> dict[str, Any]:
    """A chat refused: its one `error` frame, no token before it."""
    await client.send(
        {"type": "chat", "id": chat_id, "messages": [{"role": "user", "content": text}]}
    )
    tokens, last = await client.until_end(chat_id, timeout=30)
    assert last["type"] == "error" and not tokens, (tokens, last)
    return last


def _entries(stack: Stack) -> int:
    client = stack.redis()
    return sum(int(client.zcard(k)) for k in client.scan_iter(f"{stack.prefix}:cache:lru:*"))


async def _stored(
    client: Client, text: str | list[dict[str, str]], tag: str, stack: Stack | None = None
) -> str:
    """Ask once uncached; wait until the answer is in Redis, then 1 s (the promised sync)."""
    before = _entries(stack) if stack else 0
    answer, done = await _ask(client, f"{tag}-seed", text)
    assert done["cached"] is False
    if stack is not None:
        # The write is off the hot path (after `done`); the first chat also loads the model.
        deadline = time.monotonic() + 15
        while _entries(stack) <= before and time.monotonic() < deadline:  # noqa: ASYNC110 - another process writes
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    return answer


async def test_repeat_is_replayed_from_cache_with_usage_and_timings(cstack: Stack) -> None:
    """The same question again streams the stored answer as tokens; done says cached=true."""
    client = await _client(cstack)
    answer = await _stored(client, "What is the return policy for shoes?", "r", cstack)
    again, done = await _ask(client, "r-again", "what is the return policy for shoes")
    assert done["cached"] is True and again == answer
    assert done["usage"]["completion_tokens"] > 0
    assert "cache_ms" in done["timings"] and "total_ms" in done["timings"]
    await client.ws.close()


async def test_an_exact_repeat_known_to_every_worker_is_served_whole(cstack: Stack) -> None:
    """Once every worker's index holds the exact request (synced within 1 s), a repeat takes
    the path that answers before retrieval starts (workers/chat/run.py `_exact_known`): the same
    answer, whole and in order, on whichever worker gets it, with no retrieval stage."""
    client = await _client(cstack)
    question = "How long does shipping to Canada take?"
    answer = await _stored(client, question, "x", cstack)
    for i in range(3):  # either worker may take it
        again, done = await _ask(client, f"x-again-{i}", question)
        assert done["cached"] is True and again == answer
        assert "cache_ms" in done["timings"] and "retrieval_ms" not in done["timings"], done
    await client.ws.close()


async def test_paraphrase_is_served_by_either_worker_within_a_second(cstack: Stack) -> None:
    """An entry stored by one worker process is served by both within 1 s."""
    client = await _client(cstack)
    answer = await _stored(client, "How do I reset my password?", "p", cstack)
    ids = [f"p{i}" for i in range(8)]
    for chat_id in ids:  # concurrently, so both chat workers take some
        await client.chat(chat_id, "How can I reset my password?")
    for chat_id in ids:
        tokens, done = await client.until_end(chat_id, timeout=30)
        assert done["type"] == "done" and done["cached"] is True, done
        assert "".join(t["text"] for t in tokens) == answer
    await client.ws.close()


async def test_with_a_head_start_a_semantic_hit_never_reaches_the_engine(
    services: Services, migrated: str, tmp_path: Any
) -> None:
    """FIRSTTOKEN_CACHE_HEAD_START_MS: the engine request waits for the lookup (up to the head
    start), so a semantic hit costs the engine nothing; a miss still goes to it."""
    with make_stack(
        services,
        migrated,
        tmp_path,
        workers=1,
        bulk=False,
        sim_args=("--ttft-ms", "200", "--itl-ms", "5", "--max-tokens", "32"),
        cache_head_start_ms="1000",  # far above an embedding, even on a loaded machine
        cache_max_error_rate="0.02",  # threshold 0.73: a paraphrase is a hit (see cstack)
        cache_verify_rate="0",  # no verification request of the hit (5% by default)
    ) as s:
        s.wait_ready()
        client = await _client(s)
        answer = await _stored(client, "How do I reset my password?", "h", s)
        started = s.sim_metric("firsttoken_sim_requests_started_total")
        again, done = await _ask(client, "h-again", "How can I reset my password?")
        assert done["cached"] is True and again == answer
        assert s.sim_metric("firsttoken_sim_requests_started_total") == started
        _, miss = await _ask(client, "h-miss", "Which colours does the rain jacket come in?")
        assert miss["cached"] is False
        assert s.sim_metric("firsttoken_sim_requests_started_total") == started + 1
        await client.ws.close()


@pytest.mark.parametrize(
    ("seed", "trap"),
    [
        ("Is it safe to take aspirin with ibuprofen?", "Is it unsafe to take aspirin with ibuprofen?"),  # noqa: E501
        ("Track order 48213", "Track order 48231"),
    ],
)  # fmt: skip
async def test_traps_are_not_served(cstack: Stack, seed: str, trap: str) -> None:
    """Near-identical questions with a different answer go to the engine."""
    client = await _client(cstack)
    await _stored(client, seed, "t", cstack)
    _, done = await _ask(client, "t-trap", trap)
    assert done["cached"] is False
    await client.ws.close()


async def test_cache_false_bypasses(cstack: Stack) -> None:
    """A client asking cache:false gets a fresh generation even for a cached question."""
    client = await _client(cstack)
    await _stored(client, "Which payment methods do you accept?", "b", cstack)
    _, done = await _ask(client, "b2", "Which payment methods do you accept?", cache=False)
    assert done["cached"] is False
    await client.ws.close()


async def test_tenants_are_isolated(cstack: Stack) -> None:
    """Another tenant never gets this tenant's cached answer."""
    other_key = await asyncio.to_thread(_migrate_and_key, cstack.services.database_url)
    mine, theirs = await _client(cstack), await _client(cstack, other_key)
    await _stored(mine, "What is the warranty period for this laptop?", "i", cstack)
    _, done = await _ask(theirs, "i2", "What is the warranty period for this laptop?")
    assert done["cached"] is False
    await mine.ws.close()
    await theirs.ws.close()


# Questions a cache must survive: no words at all, two scripts, a code block, and a pasted text
# near the gateway's 100,000-character limit (max_message_chars).
_ODD = [
    ("emoji", "\U0001f642\U0001f642\U0001f642\u2753"),
    ("mixed", "Python \u91cc\u600e\u4e48 reverse \u4e00\u4e2a list\uff1f"),
    ("code", "```python\nfor i in range(3):\n    print(i\n```\nWhy is this a syntax error?"),
    ("long", "Summarise this log. " + "line of log text 0123456789 " * 3500),
]


@pytest.mark.parametrize(("tag", "question"), _ODD, ids=[t for t, _ in _ODD])
async def test_odd_questions_are_replayed_only_to_the_same_tenant_and_system_prompt(
    cstack: Stack, tag: str, question: str
) -> None:
    """An odd question is cached and replayed like any other: to its tenant, under its system
    prompt; another tenant or system prompt gets the engine. The worker never fails on it."""
    other_key = await asyncio.to_thread(_migrate_and_key, cstack.services.database_url)
    mine, theirs = await _client(cstack), await _client(cstack, other_key)
    answer = await _stored(mine, question, f"odd-{tag}", cstack)
    again, done = await _ask(mine, f"odd-{tag}-again", question)
    assert done["cached"] is True and again == answer
    system = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": question},
    ]
    _, under_another_prompt = await _ask(mine, f"odd-{tag}-system", system)
    _, for_another_tenant = await _ask(theirs, f"odd-{tag}-tenant", question)
    assert under_another_prompt["cached"] is False
    assert for_another_tenant["cached"] is False
    await mine.ws.close()
    await theirs.ws.close()


# 10 copies: past the 128th token, so the two ends are not read; 60: past JUDGE_OFF_LOOP_CHARS,
# so the candidates are judged on the embedding thread.
@pytest.mark.parametrize("copies", [10, 60])
async def test_a_long_text_alike_in_what_the_model_reads_is_not_served(
    cstack: Stack, copies: int
) -> None:
    """MiniLM reads a question's first 128 tokens: two pasted reports alike up to there but
    naming another cause at their end embed as one. The one whose end differs goes to the
    engine; the same report with another word up front ("Summarize") is served."""
    client = await _client(cstack)
    report = f"Here is incident report {copies}, filled in. Read it and tell me the root cause. "
    report *= copies
    end = " In the end the cache layer timed out under load."
    tag = f"longtail{copies}"
    answer = await _stored(client, "Summarise this report: " + report + end, tag, cstack)
    other = "Summarise this report: " + report + " In the end a bad firewall rule dropped traffic."
    _, done = await _ask(client, f"{tag}-other", other)
    assert done["cached"] is False
    again, done = await _ask(client, f"{tag}-z", "Summarize this report: " + report + end)
    assert done["cached"] is True and again == answer
    await client.ws.close()


async def test_a_fixed_snippet_is_not_answered_with_the_broken_ones_answer(cstack: Stack) -> None:
    """Code is compared as written: the snippet with its closing bracket, or another operator,
    is another question (before, both tiers folded them together); the same snippet again is
    a repeat."""
    client = await _client(cstack)
    broken = "Why does this fail?\n```\nfor i in range(3): print(i\n```"
    answer = await _stored(client, broken, "code", cstack)
    again, done = await _ask(client, "code-again", broken + "\n")
    assert done["cached"] is True and again == answer
    _, fixed = await _ask(client, "code-fixed", broken.replace("print(i", "print(i)"))
    _, other_op = await _ask(client, "code-op", broken.replace("range(3)", "range(3) * 2"))
    assert fixed["cached"] is False and other_op["cached"] is False
    await client.ws.close()


async def test_a_blank_question_is_refused_and_the_connection_goes_on(cstack: Stack) -> None:
    """Whitespace alone is no question (issue 42): `invalid_request` before anything reaches
    the cache or the engine, and the next chat on the connection is served as usual."""
    client = await _client(cstack)
    for i in range(2):
        frame = await _error(client, f"blank{i}", " \n\t ")
        assert frame["code"] == "invalid_request", frame
    answer = await _stored(client, "Do you sell gift cards?", "blank-next", cstack)
    again, done = await _ask(client, "blank-next-again", "Do you sell gift cards?")
    assert done["cached"] is True and again == answer
    await client.ws.close()


async def test_follow_up_in_another_conversation_is_not_served(cstack: Stack) -> None:
    """'Can you cancel it?' about one order is not the answer about another order."""
    client = await _client(cstack)

    def convo(order: str, item: str) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": f"I ordered {item} last week, order {order}."},
            {"role": "assistant", "content": f"I found order {order}: {item}, shipped Monday."},
            {"role": "user", "content": "Can you cancel it?"},
        ]

    await _stored(client, convo("48213", "a blue jacket"), "c1", cstack)
    _, same = await _ask(client, "c2", convo("48213", "a blue jacket"))
    _, other = await _ask(client, "c3", convo("77120", "running shoes"))
    assert same["cached"] is True and other["cached"] is False
    await client.ws.close()


async def test_a_follow_up_after_the_same_turns_is_served_among_many_conversations(
    cstack: Stack,
) -> None:
    """The same follow-up stored after six other orders' turns, then after this order's: a
    reworded follow-up after this order's turns (normalised alike) finds this order's entry,
    however many other conversations ask the same (more than the lookup's 4 candidates)."""
    client = await _client(cstack)

    def convo(order: str, question: str) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": f"I ordered item {order} last week, order {order}."},
            {"role": "assistant", "content": f"I found order {order}: shipped Monday."},
            {"role": "user", "content": question},
        ]

    for n, order in enumerate(("11801", "11802", "11803", "11804", "11805", "11806")):
        await _stored(client, convo(order, "Can you cancel it?"), f"h{n}")
    answer = await _stored(client, convo("11807", "Can you cancel it?"), "h7", cstack)
    alike = convo("11807", "can you please cancel it")
    alike[0]["content"] = alike[0]["content"].upper().rstrip(".")  # normalised the same
    served, done = await _ask(client, "h-alike", alike)
    assert done["cached"] is True and served == answer, done
    _, other = await _ask(client, "h-other", convo("11808", "can you please cancel it"))
    assert other["cached"] is False
    await client.ws.close()


async def test_a_stored_conversations_follow_up_is_served_after_the_same_turns(
    cstack: Stack,
) -> None:
    """Server-kept conversations (issue 45): a follow-up is keyed on the history the worker
    read, as a client-kept one on the history it was sent. After the same turns as an earlier
    conversation it is served (reworded too), and the turn served is the conversation's own:
    the next turn reads it. After other turns, or with `cache: false`, the engine answers."""
    client = await _client(cstack)
    tag = uuid.uuid4().hex[:8]
    opening = f"I ordered a green scarf last week, order {tag}."
    follow_up, then = "Can you cancel it?", "When will the refund reach my card?"

    async def turn(
        chat_id: str, text: str, conversation: str, stored: bool = False, **extra: Any
    ) -> tuple[str, dict[str, Any]]:
        before = _entries(cstack)
        answer, done = await _ask(client, chat_id, text, conversation_id=conversation, **extra)
        if stored:  # the entry written (off the hot path) and synced to both workers
            deadline = time.monotonic() + 15
            while _entries(cstack) <= before and time.monotonic() < deadline:  # noqa: ASYNC110 - another process writes
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
        return answer, done

    a1, done = await turn("sa1", opening, "new", stored=True)
    conv_a = done["conversation_id"]
    a2, done = await turn("sa2", follow_up, conv_a, stored=True)
    assert done["cached"] is False
    a3, done = await turn("sa3", then, conv_a, stored=True)
    assert done["cached"] is False

    b1, done = await turn("sb1", opening, "new")
    conv_b = done["conversation_id"]
    assert done["cached"] is True and b1 == a1 and conv_b != conv_a
    b2, done = await turn("sb2", follow_up, conv_b)
    assert done["cached"] is True and b2 == a2, done
    assert done["conversation_id"] == conv_b
    # Served only if both turns served from the cache were written to B as A's were.
    b3, done = await turn("sb3", then, conv_b)
    assert done["cached"] is True and b3 == a3, done

    _, done = await turn("sd1", opening, "new")
    reworded, done = await turn("sd2", "could you please cancel it", done["conversation_id"])
    assert done["cached"] is True and reworded == a2, done

    _, done = await turn("sc1", f"I ordered a red hat last week, order {tag}.", "new")
    _, done = await turn("sc2", follow_up, done["conversation_id"])
    assert done["cached"] is False

    _, done = await turn("se1", opening, "new")
    _, done = await turn("se2", follow_up, done["conversation_id"], cache=False)
    assert done["cached"] is False
    await client.ws.close()


async def test_high_temperature_and_truncated_answers_are_not_cached(cstack: Stack) -> None:
    """Answers sampled hot or cut by max_tokens are never stored."""
    client = await _client(cstack)
    for tag, extra in (("hot", {"temperature": 1.0}), ("cut", {"max_tokens": 2})):
        text = f"Tell me about {tag} answers and caching"
        _, done = await _ask(client, f"{tag}1", text, **extra)
        assert done["cached"] is False
        if tag == "cut":
            assert done["finish_reason"] == "length"
        await asyncio.sleep(1.0)
        _, done = await _ask(client, f"{tag}2", text, **extra)
        assert done["cached"] is False, tag
    await client.ws.close()


async def test_restarted_workers_rebuild_from_redis(cstack: Stack) -> None:
    """After every chat worker restarts, a paraphrase is still served (index rebuilt)."""
    client = await _client(cstack)
    answer = await _stored(client, "How do I export my data?", "w", cstack)
    for name in ("chat0", "chat1"):
        cstack.procs[name].stop()
    await asyncio.to_thread(cstack.start_worker, "chat0")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _ = await asyncio.to_thread(cstack.get, "/readyz")
        if status == 200:
            break
        await asyncio.sleep(0.3)
    again, done = await _ask(client, "w2", "How can I export my data?")
    assert done["cached"] is True and again == answer
    await client.ws.close()


@contextmanager
def verifying_stack(
    services: Services, migrated: str, tmp_path: Any, *, bulk: bool, ttft_ms: int
) -> Iterator[Stack]:
    """One chat worker that verifies every semantic hit (the embedding judge: one engine call
    per check, the re-ask), with or without a bulk worker to run the checks."""
    with make_stack(
        services,
        migrated,
        tmp_path,
        workers=1,
        bulk=bulk,
        sim_args=("--ttft-ms", str(ttft_ms), "--itl-ms", "5", "--max-tokens", "16"),
        first_token_deadline_s="10",
        cache_verify_rate="1.0",
        cache_verify_judge="embedding",
    ) as s:
        s.wait_ready()
        yield s


async def test_a_semantic_hit_is_verified_by_the_bulk_pool_after_its_answer(
    services: Services, migrated: str, tmp_path: Any
) -> None:
    """With cache_verify_rate=1 a semantic hit is answered from the cache at once; its check
    goes to the bulk queue's lowest-priority list, and the chat worker asks the engine nothing
    more. Only once a bulk worker starts is the question asked of the simulator again and the
    verdict written."""
    with verifying_stack(services, migrated, tmp_path, bulk=False, ttft_ms=1000) as s:
        client = await _client(s)
        await _stored(client, "How do I reset my password?", "v", s)
        started = s.sim_metric("firsttoken_sim_requests_started_total")
        t0 = time.monotonic()
        _, done = await _ask(client, "v-hit", "How can I reset my password?")
        took = time.monotonic() - t0
        assert done["cached"] is True, done
        assert took < 0.9, took  # the hit did not wait for the engine's first token
        # This stack's counters only: other stacks on the same Redis (xdist, other runs) verify too.
        stats = f"{s.prefix}:cache:stats:*"
        verify_list = Keys(s.prefix).verify_list()

        def verified(r: Any) -> int:
            keys = [k for k in r.scan_iter(match=stats) if not k.endswith("tenants")]
            return sum(int(r.hget(k, "verified") or 0) for k in keys)

        with s.redis() as r:
            deadline = time.monotonic() + 10
            while not r.llen(verify_list) and time.monotonic() < deadline:  # noqa: ASYNC110 - the worker writes it
                await asyncio.sleep(0.05)
            (message,) = r.lrange(verify_list, 0, -1)
            assert json.loads(message)["headers"]["task"] == "firsttoken.cache_verify"
            await asyncio.sleep(1.5)  # the engine's first token would have come by now
            assert verified(r) == 0
        # Only the request the hit raced (head start 0: aborted once the hit was found).
        assert s.sim_metric("firsttoken_sim_requests_started_total") == started + 1

        s.start_worker("bulk", "bulk")
        with s.redis() as r:
            deadline = time.monotonic() + 30
            while not verified(r) and time.monotonic() < deadline:  # noqa: ASYNC110 - the worker writes it
                await asyncio.sleep(0.2)
            assert verified(r) == 1
            assert r.llen(verify_list) == 0
        assert s.sim_metric("firsttoken_sim_requests_started_total") == started + 2
        await client.ws.close()


async def test_a_verification_is_billed_and_one_over_the_tenants_limits_is_skipped(
    services: Services, migrated: str, tmp_path: Any
) -> None:
    """Verification spends the tenant's rate limits and is billed (issue 45), through the
    whole stack: the default tenant's sampled hit is asked of the engine again and its usage
    row, door `verify`, reaches PostgreSQL through the bulk worker; a tenant allowed 2
    requests a minute has spent them on its two chats, so its hit's verification is skipped,
    counted, and never reaches the engine."""
    settings = Settings(database_url=services.database_url)
    limited = await create_key(settings, f"t-{uuid.uuid4().hex[:6]}", tenant_rpm=2)
    with verifying_stack(services, migrated, tmp_path, bulk=True, ttft_ms=200) as s:
        client = await _client(s, limited.key)
        await _stored(client, "How do I reset my password?", "b", s)
        started = s.sim_metric("firsttoken_sim_requests_started_total")
        _, done = await _ask(client, "b-hit", "How can I reset my password?")
        assert done["cached"] is True, done
        stats = f"{s.prefix}:cache:stats:{limited.tenant_id}"
        with s.redis() as r:
            deadline = time.monotonic() + 15
            while not r.hget(stats, "skipped_limit") and time.monotonic() < deadline:  # noqa: ASYNC110 - the worker writes it
                await asyncio.sleep(0.1)
            assert r.hget(stats, "skipped_limit") == "1", r.hgetall(stats)
            assert not r.hget(stats, "verified")
        # Only the request the hit raced (aborted once the hit was found): no verification.
        assert s.sim_metric("firsttoken_sim_requests_started_total") == started + 1
        await client.ws.close()

        client = await _client(s)
        await _stored(client, "How do I reset my password?", "a", s)
        await client.chat("a-hit", "How can I reset my password?")
        job_id = (await client.next_for("a-hit"))["job_id"]
        _, done = await client.until_end("a-hit")
        assert done["cached"] is True, done
        rows = await _usage(services.database_url, f"{job_id}-reask", timeout=30)
        (served,) = await _usage(services.database_url, job_id)
        await client.ws.close()
    (row,) = rows
    assert (row.door, row.route, row.status) == ("verify", "verify", "ok")
    assert row.tenant_id == served.tenant_id and row.key_id == served.key_id
    assert row.prompt_tokens > 0 and row.completion_tokens > 0
    assert row.cache_tier is None and not row.cached
    assert (served.cached, served.cache_tier, served.door) == (True, "semantic", "websocket")
