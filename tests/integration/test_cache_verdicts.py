"""The cache's online verification on real Redis (issue 45): `firsttoken cache report` over
counters and verdicts written by the worker's own code, and the LLM judge through an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.cacheverify import stats, verifying_stage
from tests.integration.conftest import Services
from tests.support import ROOT
from workers.cache.online import threshold_in_force
from workers.cache.stage import CacheStage

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
        "undecided", "est.", "wrong", "95%", "bound", "threshold",
    ]  # fmt: skip
    cells = {line.split()[0]: line.split() for line in lines}
    assert cells["acme"] == ["acme", "20", "5", "3", "12", "501", "1", "1", "0.20%",
                             f"{acme['bound'] * 100:.2f}%", "0.94"]  # fmt: skip
    assert cells["beta"] == ["beta", "2", "0", "0", "2", "0", "0", "0", "-", "-", "-"]
    assert cells["gamma"][-3:] == ["0.00%", "100.00%", "1.00"]
