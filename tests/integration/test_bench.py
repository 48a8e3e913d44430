"""`firsttoken bench` end to end on the tiny profile: a started stack, the engine directly and
the naive pattern, a handful of requests each. Asserts behaviour, never speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firsttoken.bench.cli import main
from tests.support import postgres_available, redis_available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _small_run(tmp_path: Path, modes: str) -> dict[str, Any]:
    """`firsttoken bench` on the tiny profile, a handful of requests per mode; its JSON."""
    out = tmp_path / "bench.json"
    rc = main(
        [
            "--profile",
            "tiny",
            "--modes",
            modes,
            "--concurrency",
            "3",
            "--requests",
            "6",
            "--warmup",
            "2",
            "--workers",
            "1",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_bench_runs_every_mode_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _small_run(tmp_path, "stack,direct,naive")
    assert {"machine", "command", "settings", "profile", "aggregate", "runs"} <= set(data)
    assert [r["mode"] for r in data["runs"]] == ["stack", "direct", "naive"]
    for run in data["runs"]:
        s = run["summary"]
        assert (s["requests"], s["ok"], s["errors"]) == (6, 6, 0), run["mode"]
        assert s["tokens"] > 0 and s["cached"] == 0
        assert {"p50", "p90", "p99"} <= set(s["ttft_ms"])
    modes = data["aggregate"]["c=3"]["modes"]
    # The naive pattern shows nothing until the answer is complete.
    assert modes["naive"]["ttft_ms_p50"]["median"] == modes["naive"]["total_ms_p50"]["median"]
    assert set(data["aggregate"]["c=3"]["added_ttft_ms"]) == {"stack", "naive"}
    printed = capsys.readouterr().out
    assert "Added time to first token" in printed and "Before/after at c=3" in printed
    # CPU per answered request, the machine's Redis included (it runs on this machine).
    assert "CPU per answered request" in printed
    stack_run = data["runs"][0]
    assert "redis" in stack_run["server_cpu_share"]
    assert 0 < stack_run["machine_busy"] <= 1
    cpu = modes["stack"]["cpu_ms_per_request"]
    assert cpu["stack"]["median"] > 0 and cpu["client"]["median"] > 0
    assert data["aggregate"]["c=3"]["stack_cpu_per_engine_cpu"]["median"] > 0
    if postgres_available():
        assert "database: PostgreSQL (fresh database)" in data["stack"]["notes"]


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_open_loop_with_cache_counts_hits_through_two_gateways(tmp_path: Path) -> None:
    out = tmp_path / "open.json"
    rc = main(
        [
            "--profile",
            "tiny",
            "--modes",
            "stack",
            "--rate",
            "40",
            "--requests",
            "12",
            "--warmup",
            "0",
            "--workers",
            "1",
            "--gateways",
            "2",
            "--cache",
            "on",
            "--repeat-share",
            "0.5",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    s = data["runs"][0]["summary"]
    assert s["requests"] == 12 and s["errors"] == 0
    # Both gateway processes were started, found ready, and had their CPU read.
    assert data["stack"]["gateways"] == 2
    assert {"gateway0", "gateway1"} <= set(data["runs"][0]["server_cpu_share"])
    assert 0 <= s["cached"] <= s["ok"]  # hits only once the stack has an answer cache


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_bench_openai_mode_runs_beside_the_websocket(tmp_path: Path) -> None:
    """`--modes stack,openai,direct`: the same load through both gateway doors and the engine."""
    data = _small_run(tmp_path, "stack,openai,direct")
    assert [r["mode"] for r in data["runs"]] == ["stack", "openai", "direct"]
    for run in data["runs"]:
        s = run["summary"]
        assert (s["requests"], s["ok"], s["errors"]) == (6, 6, 0), run["mode"]
        assert s["tokens"] > 0 and s["cached"] == 0
    assert {"stack", "openai"} <= set(data["aggregate"]["c=3"]["added_ttft_ms"])


@pytest.mark.skipif(not redis_available(), reason="needs the machine's Redis")
def test_interleaved_mode_reports_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--interleave` (issue 43): the engine and every door (the websocket, Chat Completions and
    the Responses API, issue 44) in one run, one stream and a burst; every mode's run, the added
    first token and gap, the hops and the CPU per chat."""
    out = tmp_path / "bench.json"
    doors = ("stack", "openai", "responses")
    args = ["--profile", "tiny", "--modes", "direct,stack,openai,responses", "--interleave"]
    args += ["--concurrency", "1,4", "--requests", "8", "--warmup", "1", "--workers", "1"]
    assert main([*args, "--no-progress", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    runs = {(r["mode"], r["load"]) for r in data["runs"]}
    assert runs == {(m, c) for m in ("direct", *doors) for c in ("c=1", "c=4")}
    for run in data["runs"]:
        s = run["summary"]
        assert run["interleaved"] and s["errors"] == 0 and s["ok"] >= 2, run["mode"]
        assert s["ttft_ms"]["p99"] > 0 and s["gap_ms"]["p50"] > 0
        assert s["tokens"] > 0 and s["cached"] == 0, run["mode"]  # the final event was read
        if run["mode"] != "direct":  # every door carries the chat's hop timings
            assert {"accept_ms", "queue_ms", "engine_ttft_ms", "relay_ms"} <= set(
                s["server_stages_ms"]
            ), run["mode"]
            assert {"gateway", "redis", "sim"} <= set(run["server_cpu_share"])
        else:
            assert set(run["server_cpu_share"]) <= {"sim"}
    for load in ("c=1", "c=4"):
        entry = data["aggregate"][load]
        for mode in doors:
            for field in ("added_ttft_ms", "added_gap_ms"):
                assert {"p50", "p99"} <= set(entry[field][mode]), (load, mode, field)
            assert entry["modes"][mode]["cpu_ms_per_request"]["stack"]["median"] > 0
    printed = capsys.readouterr().out
    assert "(interleaved)" in printed and "added gap p50 / p99" in printed
    assert "responses c=1 #1 (interleaved)" in printed
