"""What the chat metrics cost one chat, in CPU, in prometheus_client's multiprocess mode.

    python bench/metrics_cost.py [--chats 20000] [--processes 5]

Runs the calls one chat makes (shared/metrics/): on the worker, a cache lookup, the in-flight
gauge up and down and the chat's end (queue wait, status, tokens, time per output token); on
the gateway, the relayed `done` (time to first token and seven stages). Each is timed over
`--chats` chats in this process, writing to a temporary multiprocess directory, best of 5.
Then one scrape's merge (GET /metrics' work) over `--processes` processes' files.
The stack's CPU per chat (docs/benchmarks.md: some 19-35 ms on the 2-core host) is the scale.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass

from shared.metrics import multiproc


@dataclass(frozen=True)
class _Ending:
    model: str = "chat-8b"
    status: str = "ok"
    finish_reason: str = "stop"
    cached: bool = False
    prompt_tokens: int = 40
    completion_tokens: int = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=20000, help="chats timed per round")
    parser.add_argument("--processes", type=int, default=5, help="processes' files merged")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="ft-metrics-cost-")
    multiproc.enable(directory)

    from shared.metrics.recorder import Recorder
    from shared.metrics.series import Series
    from shared.protocol import Message
    from shared.tasks import ChatJob

    recorder = Recorder()
    recorder.series, recorder.directory = Series(None), directory
    recorder.models_known(["chat-8b"])
    load = recorder.worker_load("worker@bench", 64)
    assert load is not None
    now = time.time()
    job = ChatJob(
        job_id="j", chat_id="c", tenant_id="t", key_id="k",
        messages=[Message(role="user", content="hi")], max_tokens=128,
        received_at=now, enqueued_at=now + 0.001, deadline_at=now + 10,
    )  # fmt: skip
    points = {"worker_start": now + 0.003, "cache_decided": now + 0.006,
              "retrieval_done": now + 0.004, "engine_first_token": now + 0.154,
              "first_chunk_published": now + 0.1545, "finished": now + 2.1}  # fmt: skip
    timings = {"accept_ms": 0.6, "queue_ms": 2.1, "cache_ms": 3.0, "retrieval_ms": 1.0,
               "engine_ttft_ms": 150.2, "publish_ms": 0.5, "relay_ms": 0.4, "ttft_ms": 157.0,
               "total_ms": 2100.0}  # fmt: skip
    ending = _Ending()

    def worker() -> None:
        recorder.cache_lookup("miss", False)
        load.inc()
        load.dec()
        recorder.chat_ended(job, points, ending, now + 2.1)

    def gateway() -> None:
        recorder.chat_done(timings, "chat-8b", False)

    for name, call in (("worker", worker), ("gateway", gateway)):
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            for _ in range(args.chats):
                call()
            best = min(best, time.process_time() - started)
        print(f"{name} side: {best / args.chats * 1e6:.1f} us CPU per chat")

    # More processes' files, as a host with gateways and workers has: copies of this one's.
    import shutil
    from pathlib import Path

    for i in range(1, args.processes):
        for path in Path(directory).glob(f"*_{multiproc.process_id()}.db"):
            shutil.copy(path, path.with_name(path.name.replace(multiproc.HOST, f"copy{i}")))
    best = float("inf")
    for _ in range(20):
        started = time.process_time()
        text = recorder.exposition([], {"chat": 0, "bulk": 0, "summarize": 0})
        best = min(best, time.process_time() - started)
    print(f"one scrape over {args.processes} processes: {best * 1e3:.1f} ms CPU, {len(text)} bytes")
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
