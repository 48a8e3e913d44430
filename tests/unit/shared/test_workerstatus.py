"""The status record a worker's heartbeat writes (workers/workerstatus.py)."""

from __future__ import annotations

from workers.workerstatus import STATUS_VERSION, WorkerStatus, decode_status


def status(**fields: object) -> WorkerStatus:
    values: dict[str, object] = {
        "name": "chat@h",
        "queues": ("chat",),
        "host": "h",
        "pid": 42,
        "in_flight": 3,
        "capacity": 256,
        "done": 10,
        "engine_errors": 1,
        "started_at": 100.0,
        "beat_at": 200.0,
        **fields,
    }
    return WorkerStatus.model_validate(values)


def test_a_record_reads_back_as_written() -> None:
    record = status()
    assert decode_status(record.encode()) == record
    assert decode_status(record.encode().encode()) == record


def test_a_record_of_another_version_or_no_record_at_all_is_skipped() -> None:
    assert decode_status(status(v=STATUS_VERSION + 1).encode()) is None
    assert decode_status("not json") is None
    assert decode_status('{"name": "chat@h"}') is None


def test_a_worker_is_stale_only_past_the_lost_after_age() -> None:
    record = status(beat_at=200.0)
    assert record.age_s(201.5) == 1.5
    assert not record.stale(202.0, lost_s=2.0)
    assert record.stale(202.5, lost_s=2.0)


def test_a_beat_from_a_clock_ahead_has_age_zero_not_negative() -> None:
    assert status(beat_at=200.0).age_s(199.0) == 0.0
