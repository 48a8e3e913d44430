"""What a worker's heartbeat reports about its load (workers/chat/load.py)."""

from __future__ import annotations

from types import SimpleNamespace

from workers.chat.load import WorkerLoad, chat_pool_probe


def test_chats_count_as_done_and_engine_errors_count_apart() -> None:
    load = WorkerLoad()
    for reason in ("stop", "engine_error", "cancelled", "timeout", "engine_error"):
        load.ended(reason)
    assert (load.done, load.engine_errors) == (5, 2)
    assert load.sample() == (0, 0, 5)  # no pool watched yet: nothing in flight, no capacity


def test_the_chat_pool_reports_its_running_chats_and_slots() -> None:
    load = WorkerLoad()
    reader = SimpleNamespace(running={1, 2}, concurrency=8)
    load.watch(chat_pool_probe(reader))
    load.ended("stop")
    assert load.sample() == (2, 8, 1)
    reader.running = set()
    assert load.sample() == (0, 8, 1)


def test_a_pool_that_counts_its_own_tasks_reports_them_as_done() -> None:
    load = WorkerLoad()
    load.watch(lambda: (1, 3, 40))
    assert load.sample() == (1, 3, 40)


def test_a_probe_that_fails_mid_read_repeats_the_last_sample() -> None:
    load = WorkerLoad()
    answers: list[object] = [(1, 3, 7), RuntimeError("dictionary changed size")]

    def probe() -> tuple[int, int, int | None]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    load.watch(probe)
    assert load.sample() == (1, 3, 7)
    assert load.sample() == (1, 3, 7)
