"""The cache's online verification on real Redis (issue 45): `firsttoken cache report` over
counters and verdicts written by the worker's own code, and the LLM judge through an engine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gateway.ratelimit import RateLimiter
from gateway.rates import Limits
from shared.redis.pipe import RedisPipe
from shared.tasks import ChatJob, UsageRecord, VerifyJob
from tests.integration.cacheverify import (
    UsageRows,
    chat_job,
    put_answer,
    stats,
    verifying_stage,
)
from tests.integration.conftest import Services
from tests.support import ROOT
from workers.cache.checker import MAX_WAIT_S, Checker
from workers.cache.online import parse_yes_no, threshold_in_force
from workers.cache.stage import CacheStage
from workers.engines.base import Delta, EngineRequest
from workers.engines.sim import SimEngine, SimOptions

pytestmark = pytest.mark.integration


async def _settle(stage: CacheStage) -> None:
    """Wait for the stage's background work (verifications, counters, refreshes)."""
    import asyncio

    for _ in range(200):
        pending = list(stage._pending)
        if not pending:
            return
        await asyncio.gather(*pending, return_exceptions=True)
    raise AssertionError("background work did not settle")


def _report(stage: CacheStage, fmt: str) -> str:
    """`firsttoken cache report` as an operator runs it, on the stage's Redis prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    env.update(
        FIRSTTOKEN_REDIS_URL=stage.settings.redis_url,
        FIRSTTOKEN_REDIS_PREFIX=stage.settings.redis_prefix,
    )
    done = subprocess.run(
        [sys.executable, "-m", "firsttoken", "cache", "report", "--format", fmt],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


async def test_cache_report_shows_each_tenants_counters_estimate_and_threshold(
    services: Services,
) -> None:
    async with verifying_stage(services.redis_url) as stage:
        online = stage.online
        # Lookups as the chat path counts them (an "off" lookup is not counted).
        for tier, n in (("exact", 5), ("semantic", 3), ("miss", 12), ("off", 4)):
            for _ in range(n):
                online.count("acme", tier)
        for _ in range(2):
            online.count("beta", "miss")
        await _settle(stage)
        # Verdicts as the verifier records them: acme's are clean enough (1 wrong in 500 at
        # 0.98) to lower its threshold; gamma's (5 in 150 at 0.97) send it to near repeats.
        for n in range(500):
            await online.store.record("acme", 0.98, n != 0, near=False)
        await online.store.record("acme", 0.93, True, near=True)
        await online.store.count_undecided("acme")
        for n in range(150):
            await online.store.record("gamma", 0.975, n >= 5, near=False)
        # A worker refreshes a tenant's threshold on its next lookup and publishes it; beta's
        # worker has not yet.
        online.policy_for("acme")
        online.policy_for("gamma")
        await _settle(stage)
        assert online.policy_for("acme").threshold == 0.94
        want_acme = threshold_in_force(await online.store.read("acme"), online.rule)
        assert stage.policy.threshold == 0.97  # the shipped default it started from
        assert (await stats(stage, "acme"))["threshold"] == "0.94"

        rows = {r["tenant"]: r for r in json.loads(_report(stage, "json"))}
        table = _report(stage, "table").splitlines()

    assert sorted(rows) == ["acme", "beta", "gamma"]
    acme = rows["acme"]
    assert {k: acme[k] for k in ("lookups", "exact", "semantic", "miss")} == {
        "lookups": 20,
        "exact": 5,
        "semantic": 3,
        "miss": 12,
    }
    assert (acme["verified"], acme["near_misses"], acme["disagreed"], acme["undecided"]) == (
        501,
        1,
        1,
        1,
    )
    assert acme["threshold"] == 0.94
    assert acme["verified_at_threshold"] == 500  # the near miss at 0.93 is below it
    assert acme["estimated"] == pytest.approx(want_acme.rate) == pytest.approx(1 / 500)
    assert acme["bound"] == pytest.approx(want_acme.upper)
    assert 1 / 500 < acme["bound"] <= 0.01

    gamma = rows["gamma"]
    assert (gamma["lookups"], gamma["verified"], gamma["disagreed"]) == (0, 150, 5)
    assert gamma["threshold"] == 1.0  # evidence against the shipped threshold
    assert gamma["verified_at_threshold"] == 0 and gamma["bound"] == 1.0

    beta = rows["beta"]
    assert (beta["lookups"], beta["miss"], beta["verified"]) == (2, 2, 0)
    assert beta["threshold"] is None and beta["estimated"] is None and beta["bound"] is None

    header, *lines = table
    assert header.split() == [
        "tenant", "lookups", "exact", "semantic", "miss", "verified", "disagree",
        "undecided", "skipped", "est.", "wrong", "95%", "bound", "threshold",
    ]  # fmt: skip
    cells = {line.split()[0]: line.split() for line in lines}
    assert cells["acme"] == ["acme", "20", "5", "3", "12", "501", "1", "1", "0", "0.20%",
                             f"{acme['bound'] * 100:.2f}%", "0.94"]  # fmt: skip
    assert cells["beta"] == ["beta", "2", "0", "0", "2", "0", "0", "0", "0", "-", "-", "-"]
    assert cells["gamma"][-3:] == ["0.00%", "100.00%", "1.00"]


class JudgedEngine:
    """The in-process simulator, every request recorded with its reply; with ``verdict`` the
    judge's question (and only it) is answered with that text instead, as a model that
    follows the prompt would. The simulator's own words are lorem ipsum: never yes or no."""

    name = "sim"

    def __init__(self, verdict: str | None = None) -> None:
        self.sim = SimEngine(SimOptions(ttft_ms=5, itl_ms=1))
        self.verdict = verdict
        self.calls: list[tuple[EngineRequest, str]] = []

    async def stream(self, request: EngineRequest, *, request_id: str) -> AsyncIterator[Delta]:
        judged = request.messages[-1].content.startswith("Question:")
        if judged and self.verdict is not None:
            self.calls.append((request, self.verdict))
            yield Delta(text=self.verdict, finish_reason="stop")
            return
        parts = []
        async for delta in self.sim.stream(request, request_id=request_id):
            parts.append(delta.text)
            yield delta
        self.calls.append((request, "".join(parts)))

    async def abort(self, request_id: str) -> None:
        await self.sim.abort(request_id)

    async def aclose(self) -> None:
        await self.sim.aclose()


CACHED = "Open Settings, then Security, and choose Reset password."


async def _verify_a_hit(engine: JudgedEngine, redis_url: str) -> tuple[dict[str, str], bool]:
    """A semantic hit sampled, replayed, asked of the engine again and judged by it (the
    LLM judge); the tenant's counters and whether the entry is still stored."""
    async with verifying_stage(redis_url, engine=engine, cache_verify_judge="llm") as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        job = chat_job("t", "How can I reset my password?")
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        await _settle(stage)
        redis: Any = stage.store.redis
        kept = bool(await redis.exists(stage.store.keys.cache_entry(hit.entry_id)))
        return await stats(stage, "t"), kept


async def test_the_llm_judge_asks_the_engine_and_counts_a_reply_that_is_neither_yes_nor_no(
    services: Services,
) -> None:
    engine = JudgedEngine()
    got, kept = await _verify_a_hit(engine, services.redis_url)
    (again, fresh), (judge, reply) = engine.calls
    assert again.messages[-1].content == "How can I reset my password?"
    prompt = judge.messages[-1].content
    assert "How can I reset my password?" in prompt and CACHED in prompt and fresh in prompt
    assert (judge.max_tokens, judge.temperature) == (3, 0.0)
    assert parse_yes_no(reply) is None, reply  # lorem ipsum: no verdict
    assert got.get("undecided") == "1" and "verified" not in got, got
    assert kept


@pytest.mark.parametrize(("verdict", "agree"), [("Yes.", True), ("No, they differ.", False)])
async def test_the_llm_judges_yes_or_no_is_a_verdict_in_redis(
    services: Services, verdict: str, agree: bool
) -> None:
    engine = JudgedEngine(verdict)
    got, kept = await _verify_a_hit(engine, services.redis_url)
    assert len(engine.calls) == 2
    assert got["verified"] == "1" and got.get("disagreed", "0") == ("0" if agree else "1"), got
    assert "undecided" not in got
    assert kept is agree  # a served answer judged wrong is dropped


# --- what verification costs the tenant (workers/cache/charge.py) ---------------------------


async def _admit_chat(stage: CacheStage, job: ChatJob, tokens: int) -> None:
    """The chat's own admission, as the gateway makes it (its limiter, the same script)."""
    pipe = RedisPipe(stage.settings.redis_url)
    await pipe.start()
    try:
        limits = Limits(tenant_rpm=job.tenant_rpm or 0, tenant_tpm=job.tenant_tpm or 0)
        limiter = RateLimiter(pipe, stage.store.keys, lease_s=60)
        await limiter.admit(
            job_id=job.job_id,
            key_id=job.key_id,
            tenant_id=job.tenant_id,
            limits=limits,
            tokens=tokens,
            prompt_estimate=tokens - job.max_tokens,
        )
    finally:
        await pipe.close()


def _rows(stage: CacheStage) -> list[UsageRecord]:
    return cast(UsageRows, cast(Any, stage.online.ctx).usage).rows


async def test_each_engine_call_of_a_verification_is_charged_to_the_tenant_and_billed(
    services: Services,
) -> None:
    """The re-ask and the LLM judge's question each take one request of the tenant's window,
    settled to the tokens the engine counted, and each writes a usage row, door `verify`;
    the key's own window and stream slots are not touched."""
    engine = JudgedEngine("Yes.")
    async with verifying_stage(
        services.redis_url, engine=engine, cache_verify_judge="llm"
    ) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        job = chat_job("t", "How can I reset my password?", tenant_rpm=10, tenant_tpm=10_000)
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        await _settle(stage)
        redis: Any = stage.store.redis
        keys = stage.store.keys
        window = await redis.zrange(keys.rate_window("tenant", "t"), 0, -1)
        tokens = await redis.hgetall(keys.rate_tokens("tenant", "t"))
        key_side = await redis.exists(
            keys.rate_window("key", "k"), keys.rate_tokens("key", "k"), keys.key_streams("k")
        )
        rows = _rows(stage)
        got = await stats(stage, "t")
    assert got["verified"] == "1", got
    reask, judge = sorted(rows, key=lambda r: r.route)
    assert (reask.request_id, reask.route, reask.door) == (
        f"{job.job_id}-reask",
        "verify",
        "verify",
    )
    assert (judge.request_id, judge.route, judge.door) == (
        f"{job.job_id}-judge",
        "verify-judge",
        "verify",
    )
    assert reask.tenant_id == judge.tenant_id == "t" and reask.key_id == "k"
    assert reask.prompt_tokens > 0 and reask.completion_tokens > 0 and reask.status == "ok"
    # The engine's count: the simulator's reply to the re-ask, the judge's scripted "Yes.".
    (_, fresh), _ = engine.calls
    assert fresh and judge.prompt_tokens > 0
    assert sorted(window) == sorted([reask.request_id, judge.request_id])
    # The re-ask keeps what the simulator counted; the scripted verdict counts nothing, so
    # the judge's question keeps its whole reservation (prompt estimate + 3 tokens).
    charged = {
        reask.request_id: reask.prompt_tokens + reask.completion_tokens,
        judge.request_id: judge.prompt_tokens + 3,
    }
    assert {k: int(v) for k, v in tokens.items() if k != "=sum"} == charged
    assert int(tokens["=sum"]) == sum(charged.values())
    assert key_side == 0


@pytest.mark.parametrize(
    ("limits", "reason"),
    [({"tenant_rpm": 1}, "requests"), ({"tenant_tpm": 40}, "tokens")],
)
async def test_a_verification_the_tenants_limits_refuse_is_skipped_and_counted(
    services: Services, limits: dict[str, int], reason: str
) -> None:
    """The tenant's window holds its chat (1 request of 1 a minute; 27 tokens of 40, where the
    re-ask needs 27 more): the sampled hit's verification is not sent, not billed, and is
    counted as skipped in `firsttoken cache report`."""
    engine = JudgedEngine("Yes.")
    async with verifying_stage(services.redis_url, engine=engine) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        job = chat_job("t", "How can I reset my password?", **limits)
        await _admit_chat(stage, job, tokens=27)
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        await _settle(stage)
        got = await stats(stage, "t")
        rows = _rows(stage)
        (report,) = json.loads(_report(stage, "json"))
    assert engine.calls == [] and rows == [], reason
    assert (got["skipped"], got["skipped_limit"]) == ("1", "1"), got
    assert "verified" not in got
    assert (report["skipped"], report["skipped_limit"], report["skipped_busy"]) == (1, 1, 0)


async def test_a_judges_question_the_limits_refuse_leaves_no_verdict(services: Services) -> None:
    """The re-ask takes the tenant's one request a minute; the LLM judge's question is then
    refused: skipped, no verdict (undecided), the entry kept, one row (the re-ask's)."""
    engine = JudgedEngine("No.")
    async with verifying_stage(
        services.redis_url, engine=engine, cache_verify_judge="llm"
    ) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        job = chat_job("t", "How can I reset my password?", tenant_rpm=1)
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        await _settle(stage)
        got = await stats(stage, "t")
        rows = _rows(stage)
        redis: Any = stage.store.redis
        kept = bool(await redis.exists(stage.store.keys.cache_entry(hit.entry_id)))
    assert len(engine.calls) == 1 and [r.route for r in rows] == ["verify"]
    assert (got["skipped_limit"], got["undecided"]) == ("1", "1") and "verified" not in got
    assert kept


async def test_a_sample_that_finds_every_slot_busy_is_skipped_and_counted(
    services: Services,
) -> None:
    """One verification at a time: a second sampled hit replayed while the first is still
    with the engine is counted as skipped (busy), never queued."""
    engine = JudgedEngine()
    async with verifying_stage(
        services.redis_url, engine=engine, cache_verify_concurrency=1
    ) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        jobs = [chat_job("t", "How can I reset my password?") for _ in range(2)]
        for job in jobs:
            stage.online.hit(job, "sim", hit, 0.98)
        for job in jobs:
            stage.online.replayed(job)
        await _settle(stage)
        got = await stats(stage, "t")
    assert len(engine.calls) == 1
    assert (got["skipped"], got["skipped_busy"]) == ("1", "1") and "skipped_limit" not in got


async def test_a_check_that_waited_too_long_in_the_bulk_queue_is_skipped(
    services: Services,
) -> None:
    """After a backlog (the bulk pool held up by a database outage), a check sampled more than
    MAX_WAIT_S ago is skipped and counted as stale, never sent to the engine."""
    engine = JudgedEngine()
    async with verifying_stage(services.redis_url, engine=engine) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        job = chat_job("t", "How can I reset my password?")
        sent: list[VerifyJob] = []
        stage.online._send = sent.append
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        (check,) = sent
        assert (check.entry_id, check.score, check.fresh, check.near) == (
            hit.entry_id,
            0.98,
            None,
            False,
        )
        late = check.model_copy(update={"sampled_at": time.time() - MAX_WAIT_S - 1})
        await Checker(cast(Any, stage.online.ctx), stage.embed).check(late)
        got = await stats(stage, "t")
    assert engine.calls == []
    assert (got["skipped"], got["skipped_stale"]) == ("1", "1") and "verified" not in got
    assert "skipped_busy" not in got


@pytest.mark.parametrize(("judge", "sent"), [("embedding", 1), ("llm", 0)])
async def test_near_misses_cost_the_engine_only_at_the_verify_rate(
    services: Services, judge: str, sent: int
) -> None:
    """Every near miss is compared where the judge asks the engine nothing; with the LLM judge
    (an engine call each) only a cache_verify_rate share is, as for hits."""
    async with verifying_stage(
        services.redis_url, cache_verify_judge=judge, cache_verify_rate=1e-9
    ) as stage:
        near = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        checks: list[VerifyJob] = []
        stage.online._send = checks.append
        job = chat_job("t", "How can I reset my password?")
        stage.online.near_miss(job, "sim", "How can I reset my password?", near, 0.95, "x")
    assert len(checks) == sent
    if checks:
        assert checks[0].near and checks[0].fresh == "x" and checks[0].score == 0.95


class StalledEngine(JudgedEngine):
    """An engine that takes the request and never answers."""

    async def stream(self, request: EngineRequest, *, request_id: str) -> AsyncIterator[Delta]:
        self.calls.append((request, ""))
        await asyncio.Event().wait()
        yield Delta(text="never")


async def test_a_closing_checker_cancels_its_checks_instead_of_waiting_on_the_engine(
    services: Services,
) -> None:
    """A bulk worker's shutdown does not wait on a verification's engine call: the checker
    cancels the checks still running (one sample fewer each) and records nothing for them."""
    engine = StalledEngine()
    async with verifying_stage(services.redis_url, engine=engine) as stage:
        hit = await put_answer(stage, "t", "How do I reset my password?", CACHED)
        checks: list[VerifyJob] = []
        stage.online._send = checks.append
        job = chat_job("t", "How can I reset my password?")
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        checker = Checker(cast(Any, stage.online.ctx), stage.embed)
        running = asyncio.ensure_future(checker.check(checks[0]))
        while not engine.calls:  # noqa: ASYNC110 - the check reaches the engine
            await asyncio.sleep(0.01)
        await asyncio.wait_for(checker.close(), 5)
        await asyncio.wait_for(running, 1)  # ended quietly, not raised
        assert running.exception() is None
        await checker.check(checks[0])  # a closed checker takes nothing more
        got = await stats(stage, "t")
    assert len(engine.calls) == 1
    assert "verified" not in got and "undecided" not in got
