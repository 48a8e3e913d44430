"""The bench's pure arithmetic: percentiles, summaries, added time, timelines, sustainable load."""

from __future__ import annotations

import math

import pytest

from firsttoken.bench.loadgen import PromptMix
from firsttoken.bench.stats import (
    RequestResult,
    added,
    aggregate_runs,
    cpu_ms_per_request,
    highest_sustainable,
    median_and_spread,
    percentile,
    ratio,
    summarize,
    summarize_run,
    timeline,
)


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_bad_q_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_reports_every_percentile() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s["n"] == 4 and s["mean"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0
    assert s["p50"] == 2.5
    assert set(s) == {"n", "mean", "min", "p50", "p90", "p99", "max"}
    assert math.isnan(summarize([])["p99"])


def _ok(start: float, ttft: float, total: float, tokens: int = 10, **kw: object) -> RequestResult:
    return RequestResult(start_s=start, ttft_ms=ttft, total_ms=total, tokens=tokens, **kw)  # type: ignore[arg-type]


def test_summarize_run_counts_errors_cache_hits_and_throughput() -> None:
    results = [
        _ok(0.0, 10, 100, gaps_ms=[1.0, 3.0], cached=True, server_timings={"queue_ms": 2.0}),
        _ok(0.1, 20, 200),
        RequestResult(start_s=0.2, error="timeout"),
    ]
    s = summarize_run(results, wall_s=2.0)
    assert (s["requests"], s["ok"], s["errors"], s["cached"]) == (3, 2, 1, 1)
    assert s["error_codes"] == {"timeout": 1}
    assert s["tokens"] == 20 and s["tokens_per_s"] == 10.0 and s["qps"] == 1.0
    assert s["ttft_ms"]["p50"] == 15.0
    assert s["gap_ms"]["n"] == 2
    assert s["server_queue_ms"]["n"] == 1
    # Little's law: 0.1 s + 0.2 s of answers over 2 s of run.
    assert s["in_flight_mean"] == pytest.approx(0.15)


def test_added_is_the_per_percentile_difference() -> None:
    run = {"ttft_ms": {"p50": 12.0, "p90": 15.0, "p99": 30.0}}
    base = {"ttft_ms": {"p50": 10.0, "p90": 11.0, "p99": 12.0}}
    assert added(run, base) == {"p50": 2.0, "p90": 4.0, "p99": 18.0}


def test_median_and_spread_ignores_nan() -> None:
    assert median_and_spread([3.0, 1.0, math.nan, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "n": 3.0,
    }
    assert math.isnan(median_and_spread([])["median"])


def test_aggregate_pairs_each_repeat_with_its_own_baseline() -> None:
    def summary(p50: float, p99: float) -> dict[str, object]:
        return summarize_run([_ok(0, p50, p99), _ok(0, p99, p99)], 1.0) | {
            "ttft_ms": {"p50": p50, "p90": p99, "p99": p99, "n": 2}
        }

    runs = [
        {"mode": "direct", "load": "c=1", "repeat": 0, "summary": summary(10, 20)},
        {"mode": "stack", "load": "c=1", "repeat": 0, "summary": summary(12, 25)},
        {"mode": "direct", "load": "c=1", "repeat": 1, "summary": summary(100, 200)},
        {"mode": "stack", "load": "c=1", "repeat": 1, "summary": summary(101, 210)},
    ]
    agg = aggregate_runs(runs)
    a = agg["c=1"]["added_ttft_ms"]["stack"]
    assert a["p50"]["min"] == 1.0 and a["p50"]["max"] == 2.0 and a["p50"]["median"] == 1.5
    assert a["p99"]["median"] == 7.5
    assert agg["c=1"]["modes"]["stack"]["requests"] == 4
    assert "direct" not in agg["c=1"]["added_ttft_ms"]


def test_timeline_spreads_tokens_over_the_stream() -> None:
    # One stream: first token at 0.5 s, end at 2.5 s, 20 tokens: 5 per half second... per 1 s bin:
    # bin 0 gets 0.5 s of 2 s (5 tokens), bin 1 gets 10, bin 2 gets 5.
    line = timeline([_ok(0.0, 500, 2500, tokens=20), RequestResult(start_s=0.1, error="x")], 1.0)
    assert [round(p["tokens_per_s"], 6) for p in line] == [5.0, 10.0, 5.0]
    assert sum(p["completions_per_s"] for p in line) == 1
    assert sum(p["errors_per_s"] for p in line) == 1
    assert timeline([], 1.0) == []
    with pytest.raises(ValueError):
        timeline([], 0)


def test_highest_sustainable_stops_at_the_first_failing_load() -> None:
    points = [(10.0, 5.0, True), (20.0, 30.0, True), (40.0, 80.0, True), (80.0, 10.0, True)]
    assert highest_sustainable(points, 50.0) == 20.0
    assert highest_sustainable([(10.0, 5.0, False)], 50.0) is None
    assert highest_sustainable([(10.0, math.nan, True)], 50.0) is None


def test_ratio() -> None:
    assert ratio(10_000, 100) == 100
    assert ratio(1, 0) == math.inf
    assert math.isnan(ratio(math.nan, 1))


def test_prompt_mix_is_deterministic_and_honours_shares() -> None:
    a = PromptMix(0.3, 0.2, seed=1)
    b = PromptMix(0.3, 0.2, seed=1)
    seq = [a.next() for _ in range(500)]
    assert seq == [b.next() for _ in range(500)]
    fresh = PromptMix(0.0, 0.0, seed=1)
    assert len({fresh.next() for _ in range(200)}) == 200
    repeats = len(seq) - len(set(seq))
    assert 100 < repeats < 250  # ~30% exact repeats (plus chance collisions of paraphrases)
    with pytest.raises(ValueError):
        PromptMix(0.8, 0.5)


def test_the_first_wave_of_a_closed_loop_is_summarized_apart() -> None:
    # Two streams: both start at 0 (the wave, slow), then two more each (steady, fast).
    results = [_ok(0.0, 90, 100), _ok(0.0, 80, 100)]
    results += [_ok(0.1 * i, 10 + i, 100) for i in range(1, 5)]
    s = summarize_run(list(reversed(results)), 1.0, first_wave=2)
    assert s["first_wave"] == 2
    assert s["ttft_first_wave_ms"]["n"] == 2 and s["ttft_first_wave_ms"]["min"] == 80
    assert s["ttft_after_first_wave_ms"]["max"] == 14 and s["ttft_after_first_wave_ms"]["n"] == 4
    assert s["ttft_ms"]["n"] == 6
    # Open loop: no wave; the steady summary is the whole run.
    s = summarize_run(results, 1.0)
    assert s["first_wave"] == 0 and s["ttft_after_first_wave_ms"]["n"] == 6

    runs = [
        {"mode": "direct", "load": "c=2", "repeat": 0, "summary": summarize_run(
            [_ok(0.0, 50, 60), _ok(0.0, 50, 60), _ok(0.2, 5, 60), _ok(0.3, 5, 60)], 1.0, 2)},
        {"mode": "stack", "load": "c=2", "repeat": 0, "summary": summarize_run(
            [_ok(0.0, 90, 60), _ok(0.0, 90, 60), _ok(0.2, 7, 60), _ok(0.3, 7, 60)], 1.0, 2)},
    ]  # fmt: skip
    agg = aggregate_runs(runs)["c=2"]
    assert agg["added_ttft_after_first_wave_ms"]["stack"]["p50"]["median"] == 2.0
    assert agg["added_ttft_first_wave_ms"]["stack"]["p50"]["median"] == 40.0
    assert agg["added_ttft_ms"]["stack"]["p99"]["median"] > 2.0


def test_cpu_per_request_counts_the_stack_apart_from_the_engine_and_the_client() -> None:
    summary = summarize_run([_ok(0, 10, 20)] * 4 + [RequestResult(0, None, None, error="x")], 2.0)
    run = {
        "summary": summary,  # 4 answered in 2 s
        "client_cpu_share": 0.2,
        "server_cpu_share": {
            "sim": 0.4,
            "gateway": 0.1,
            "worker-chat0": 0.3,
            "worker-bulk": 0.05,
            "redis": 0.05,
            "litellm": math.nan,
        },
    }
    per = cpu_ms_per_request(run)
    assert per["client"] == pytest.approx(100.0)  # 0.2 core * 2 s / 4 requests
    assert per["sim"] == pytest.approx(200.0)
    assert per["stack"] == pytest.approx(250.0)  # gateway, workers and Redis, not the engine
    assert "litellm" not in per
    assert cpu_ms_per_request({"summary": summarize_run([], 1.0)}) == {}


def test_aggregate_puts_the_stacks_cpu_in_units_of_the_engines_in_the_same_run() -> None:
    def run(mode: str, repeat: int, sim: float, stack: float, busy: float) -> dict[str, object]:
        return {
            "mode": mode,
            "load": "c=1",
            "repeat": repeat,
            "summary": summarize_run([_ok(0, 10, 20)] * 10, 1.0),
            "client_cpu_share": 0.1,
            "server_cpu_share": {"sim": sim, "gateway": stack / 2, "worker-chat0": stack / 2},
            "machine_busy": busy,
        }

    agg = aggregate_runs(
        [
            run("direct", 0, 0.1, 0.0, 0.2),
            run("stack", 0, 0.1, 0.5, 0.6),  # a slower moment: everything costs more
            run("direct", 1, 0.2, 0.0, 0.3),
            run("stack", 1, 0.2, 0.6, 0.7),
        ]
    )["c=1"]
    rel = agg["stack_cpu_per_engine_cpu"]  # 0.5 / 0.1 and 0.6 / 0.2
    assert rel["min"] == pytest.approx(3.0) and rel["max"] == pytest.approx(5.0)
    stack = agg["modes"]["stack"]
    assert stack["machine_busy"]["median"] == pytest.approx(0.65)
    assert stack["cpu_ms_per_request"]["stack"]["median"] == pytest.approx(55.0)


def test_a_run_is_warmed_with_as_many_requests_as_it_will_have_in_flight() -> None:
    from firsttoken.bench.cli import LoadPoint, warmup_wave

    # A closed loop: one per stream (its first wave has them all in flight at once).
    assert warmup_wave(10, LoadPoint("c=200", 200, None), 2.0) == 200
    assert warmup_wave(10, LoadPoint("c=1", 1, None), 2.0) == 10
    assert warmup_wave(300, LoadPoint("c=200", 200, None), 2.0) == 300
    # An open loop: rate x answer time (Little's law), within its in-flight cap.
    assert warmup_wave(10, LoadPoint("r=95", 2000, 95.0), 2.07) == 197
    assert warmup_wave(10, LoadPoint("r=95", 150, 95.0), 2.07) == 150
    assert warmup_wave(10, LoadPoint("r=2", 2000, 2.0), 2.07) == 10
    # 0 turns warming off.
    assert warmup_wave(0, LoadPoint("c=200", 200, None), 2.0) == 0
