"""The chat metrics (shared/metrics/): what one chat's points and ending observe, and the
series a scrape then shows; multiprocess files of a process killed outright are swept."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from shared.metrics import multiproc
from shared.metrics.recorder import Recorder
from shared.metrics.series import Series
from shared.metrics.values import cache_result, engine_error_kind, time_per_output_token
from shared.protocol import Message
from shared.tasks import ChatJob
from tests.support import ROOT

JOB = ChatJob(
    job_id="j",
    chat_id="c",
    tenant_id="t",
    key_id="k",
    messages=[Message(role="user", content="hi")],
    max_tokens=8,
    received_at=100.0,
    enqueued_at=100.002,
    deadline_at=110.0,
)
# A chat's points as the worker keeps them (shared/timing.py): 4 ms in the queue, 12 ms to the
# engine's first token, 9 more tokens in 90 ms.
POINTS = {
    "worker_start": 100.006,
    "cache_decided": 100.008,
    "retrieval_done": 100.009,
    "engine_first_token": 100.021,
    "first_chunk_published": 100.0215,
    "finished": 100.111,
}


@dataclass(frozen=True)
class Ending:
    model: str = "m"
    status: str = "ok"
    finish_reason: str = "stop"
    cached: bool = False
    prompt_tokens: int = 30
    completion_tokens: int = 10


def _recorder() -> tuple[Recorder, CollectorRegistry]:
    registry = CollectorRegistry()
    recorder = Recorder()
    recorder.series, recorder.registry = Series(registry), registry
    return recorder, registry


def test_time_per_output_token_is_decode_time_over_the_tokens_after_the_first() -> None:
    assert time_per_output_token(POINTS, 10, status="ok", cached=False) == pytest.approx(0.01)
    # Nothing to divide: one token, a cached answer, a failed chat, no engine token.
    assert time_per_output_token(POINTS, 1, status="ok", cached=False) is None
    assert time_per_output_token(POINTS, 10, status="ok", cached=True) is None
    assert time_per_output_token(POINTS, 10, status="error", cached=False) is None
    assert time_per_output_token({"finished": 1.0}, 10, status="ok", cached=False) is None


def test_engine_errors_are_the_engines_failures_and_its_missed_deadlines_only() -> None:
    assert engine_error_kind("error", "engine_error", {}) == "engine_error"
    assert engine_error_kind("timeout", "timeout", {"retrieval_done": 1.0}) == "timeout"
    # A queue deadline (the engine never asked), a cancel, a bug: not the engine's.
    assert engine_error_kind("timeout", "timeout", {"worker_start": 1.0}) is None
    assert engine_error_kind("cancelled", "cancelled", {"retrieval_done": 1.0}) is None
    assert engine_error_kind("error", "internal", {"retrieval_done": 1.0}) is None


def test_cache_results_name_the_tier_and_a_guards_refusal() -> None:
    assert cache_result("exact", False) == "exact_hit"
    assert cache_result("semantic", False) == "semantic_hit"
    assert cache_result("miss", False) == "miss"
    assert cache_result("miss", True) == "refused"
    assert cache_result("off", False) is None  # no lookup made


def test_a_workers_chat_end_observes_queue_wait_tokens_status_and_tpot() -> None:
    recorder, registry = _recorder()
    recorder.chat_ended(JOB, POINTS, Ending(), now=100.12)
    value = registry.get_sample_value
    assert value("firsttoken_queue_wait_seconds_count", {"queue": "chat"}) == 1
    assert value("firsttoken_queue_wait_seconds_sum", {"queue": "chat"}) == pytest.approx(0.004)
    # 4 ms falls in the (2.5, 5] ms bucket: a 5 ms question has an answer.
    assert value("firsttoken_queue_wait_seconds_bucket", {"queue": "chat", "le": "0.0025"}) == 0
    assert value("firsttoken_queue_wait_seconds_bucket", {"queue": "chat", "le": "0.005"}) == 1
    assert value("firsttoken_tokens_total", {"kind": "prompt"}) == 30
    assert value("firsttoken_tokens_total", {"kind": "completion"}) == 10
    assert value("firsttoken_chats_total", {"status": "ok"}) == 1
    assert value("firsttoken_time_per_output_token_seconds_count") == 1
    recorder.chat_ended(JOB, POINTS, Ending(status="error", finish_reason="engine_error"), 101.0)
    labels = {"model": "m", "kind": "engine_error"}
    assert value("firsttoken_engine_errors_total", labels) == 1
    assert value("firsttoken_chats_total", {"status": "error"}) == 1


def test_a_relayed_done_observes_ttft_by_model_and_every_stage_of_its_timings() -> None:
    recorder, registry = _recorder()
    timings = {"accept_ms": 0.4, "queue_ms": 5.0, "engine_ttft_ms": 12.0, "relay_ms": 0.3,
               "ttft_ms": 19.0, "total_ms": 120.0}  # fmt: skip
    recorder.chat_done(timings, "m", cached=False)
    value = registry.get_sample_value
    assert value("firsttoken_time_to_first_token_seconds_count", {"model": "m", "cached": "false"})
    assert value(
        "firsttoken_time_to_first_token_seconds_bucket",
        {"model": "m", "cached": "false", "le": "0.02"},
    )
    for stage in ("accept", "queue", "engine_ttft", "relay"):
        assert value("firsttoken_stage_seconds_count", {"stage": stage}) == 1, stage
    assert value("firsttoken_stage_seconds_count", {"stage": "retrieval"}) == 0


def test_lookups_and_worker_load_are_counted() -> None:
    recorder, registry = _recorder()
    recorder.cache_lookup("exact", False)
    recorder.cache_lookup("miss", True)
    recorder.cache_lookup("off", False)
    value = registry.get_sample_value
    assert value("firsttoken_cache_lookups_total", {"result": "exact_hit"}) == 1
    assert value("firsttoken_cache_lookups_total", {"result": "refused"}) == 1
    assert value("firsttoken_cache_lookups_total", {"result": "miss"}) == 0
    load = recorder.worker_load("w1", 64)
    assert load is not None
    load.inc()
    load.inc()
    load.dec()
    assert value("firsttoken_worker_capacity", {"worker": "w1"}) == 64
    assert value("firsttoken_worker_chats_in_flight", {"worker": "w1"}) == 1


def test_a_recorder_that_is_off_observes_nothing_and_exports_only_what_it_is_given() -> None:
    recorder = Recorder()
    recorder.chat_ended(JOB, POINTS, Ending(), now=100.12)
    recorder.chat_done({"ttft_ms": 5.0}, "m", cached=False)
    assert recorder.worker_load("w1", 4) is None
    text = recorder.exposition([], {"chat": 3}).decode()
    assert 'firsttoken_queue_depth{queue="chat"} 3.0' in text
    assert "firsttoken_time_to_first_token" not in text


CHILD = """
import os, sys
from shared.metrics import multiproc
multiproc.enable(sys.argv[1])
from shared.metrics.series import Series
series = Series(None)
series.process.labels("worker").set(1)
series.in_flight.labels("w9").set(3)
series.chats_of("ok").inc()
os._exit(0)  # killed, as it were: no shutdown, no mark_process_dead
"""


def test_a_killed_process_counts_stay_and_its_live_gauges_are_swept(tmp_path: Path) -> None:
    """Run in a child: multiprocess mode is a process-wide switch this test process keeps off."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, timeout=60)
    assert child.returncode == 0

    def samples() -> dict[tuple[str, str], float]:
        collected = multiproc.collected(str(tmp_path)).collect()
        return {
            (s.name, str(sorted(s.labels.items()))): s.value for m in collected for s in m.samples
        }

    before = samples()
    assert {name for name, _ in before} >= {
        "firsttoken_process",
        "firsttoken_worker_chats_in_flight",
    }
    multiproc.sweep_dead(str(tmp_path))
    after = samples()
    assert "firsttoken_process" not in {name for name, _ in after}
    assert "firsttoken_worker_chats_in_flight" not in {name for name, _ in after}
    # A counter never goes back: the dead process's chats stay counted.
    assert after[("firsttoken_chats_total", "[('status', 'ok')]")] == 1
