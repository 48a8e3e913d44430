"""Interleaved bench runs (issue 43): the random draw of modes, the split of the processes' CPU
over the requests that used them, and the added inter-chunk gap."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from firsttoken.bench.interleave import plan, rounds_for, shared_cpu_share
from firsttoken.bench.profiles import get_profile
from firsttoken.bench.stats import (
    RequestResult,
    aggregate_runs,
    cpu_ms_per_request,
    summarize_run,
)


def test_plan_gives_every_mode_its_share_in_rounds_of_the_burst_size() -> None:
    rounds = plan(["direct", "stack", "openai"], streams=32, rounds=6, seed=3)
    assert len(rounds) == 6 and all(len(r) == 32 for r in rounds)
    counts = Counter(m for r in rounds for m in r)
    assert set(counts) == {"direct", "stack", "openai"}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(counts.values()) == 192


def test_plan_is_random_but_repeatable() -> None:
    one = plan(["a", "b", "c"], streams=1, rounds=30, seed=1)
    assert one == plan(["a", "b", "c"], streams=1, rounds=30, seed=1)
    assert one != plan(["a", "b", "c"], streams=1, rounds=30, seed=2)
    # Not the modes in turn: some mode follows itself somewhere.
    flat = [r[0] for r in one]
    assert any(x == y for x, y in itertools.pairwise(flat))


def test_plan_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        plan([], streams=1, rounds=1, seed=0)
    with pytest.raises(ValueError):
        plan(["a"], streams=0, rounds=1, seed=0)
    assert plan(["a"], streams=4, rounds=0, seed=0) == []


def test_rounds_cover_the_requests() -> None:
    assert rounds_for(192, 32, 3) == 6
    assert rounds_for(10, 32, 3) == 1
    assert rounds_for(60, 1, 3) == 60
    assert rounds_for(1, 1, 3) == 6  # at least two of every mode


def test_the_stacks_cpu_is_split_over_the_requests_through_its_doors() -> None:
    cpu_s = {"sim": 3.0, "gateway": 2.0, "worker-chat0": 4.0, "redis": 1.0, "litellm": 0.5}
    ok = {"direct": 10, "stack": 10, "openai": 10}
    wall = 10.0
    stack = shared_cpu_share(cpu_s, wall, ok, "stack")
    direct = shared_cpu_share(cpu_s, wall, ok, "direct")
    assert set(direct) == {"sim"}  # a request straight to the engine costs the stack nothing
    assert "litellm" not in stack
    run = {
        "summary": {"ok": 10, "wall_s": wall},
        "server_cpu_share": stack,
        "client_cpu_share": 0.0,
    }
    per = cpu_ms_per_request(run)
    # The engine's 3 s over 30 requests; the gateway's 2 s over the 20 through the doors.
    assert per["sim"] == pytest.approx(100.0)
    assert per["gateway"] == pytest.approx(100.0)
    assert per["stack"] == pytest.approx(350.0)
    assert shared_cpu_share(cpu_s, 0.0, ok, "stack") == {}


def test_aggregate_reports_the_added_gap_between_chunks() -> None:
    def run(mode: str, gaps: list[float]) -> dict[str, object]:
        results = [RequestResult(start_s=0.0, ttft_ms=20.0, total_ms=100.0, gaps_ms=gaps)]
        return {"mode": mode, "load": "c=1", "repeat": 0, "summary": summarize_run(results, 1.0)}

    agg = aggregate_runs([run("direct", [20.0, 20.0]), run("stack", [21.0, 23.0])])
    gap = agg["c=1"]["added_gap_ms"]["stack"]
    assert gap["p50"]["median"] == pytest.approx(2.0)
    assert gap["p99"]["median"] == pytest.approx(2.98)
    assert "direct" not in agg["c=1"]["added_gap_ms"]


def test_the_public_shape_profile_answers_exactly_its_length() -> None:
    p = get_profile("on-the-bench")
    assert (p.ttft_ms, p.itl_ms, p.max_tokens) == (20.0, 20.0, 64)
    args = p.sim_args()
    # The simulator draws in [max/2, max]: given 128, a request for 64 is always cut at 64.
    assert args[args.index("--max-tokens") + 1] == "128"
