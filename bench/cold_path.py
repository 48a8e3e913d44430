"""What the first token's code costs after a pause: the same calls hot and after a sleep.

    python bench/cold_path.py [--calls 60] [--pauses 0,1,5,20,200]

At one stream each process of the stack is idle for the 20 ms between tokens, and each chat's
start runs code that has not run since the last chat's. This times a few of the first token's
steps (a websocket frame's parse, an HTTP door body's parse, a worker's read of the task
message) back to back, then each after sleeping PAUSE ms: the median per call, in us. Where a
call after a pause costs several times its hot cost, what decides the one-stream added time
to first token is how much code the path runs, not how fast it runs in a loop
(docs/benchmarks.md, issue 43).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from gateway.openai_protocol import parse_chat_request
from shared.protocol import parse_client_frame
from shared.tasks import ChatJob, parse_task_message, task_message

MESSAGES = [{"role": "user", "content": "Say something about the sea, in about sixty words."}]


def _steps() -> dict[str, Callable[[], object]]:
    frame = orjson.dumps({"type": "chat", "id": "c1", "messages": MESSAGES, "cache": False})
    body = orjson.dumps({"model": "sim", "messages": MESSAGES, "stream": True, "max_tokens": 64})
    job = ChatJob(
        job_id="j",
        chat_id="c1",
        tenant_id="t",
        key_id="k",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=64,
        received_at=0.0,
        enqueued_at=0.0,
        deadline_at=1.0,
    )
    message = task_message("chat", {"job": job.model_dump()}, queue="chat")
    return {
        "websocket frame": lambda: parse_client_frame(frame, max_bytes=1 << 20, max_messages=100),
        "HTTP door body": lambda: parse_chat_request(
            body, chat_id="c", max_bytes=1 << 20, max_messages=100
        ),
        "task message + job": lambda: ChatJob.model_validate(
            parse_task_message(message).kwargs["job"]
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=60, help="timed calls per step and pause")
    p.add_argument("--pauses", default="0,1,5,20,200", help="ms slept before each call")
    args = p.parse_args()
    pauses = [float(v) / 1000 for v in args.pauses.split(",")]
    print(f"median us per call ({args.calls} calls), after sleeping: " + ", ".join(
        f"{pause * 1000:g} ms" for pause in pauses
    ))  # fmt: skip
    for name, step in _steps().items():
        cells = []
        for pause in pauses:
            times = []
            for _ in range(args.calls):
                if pause:
                    time.sleep(pause)
                began = time.perf_counter()
                step()
                times.append(time.perf_counter() - began)
            cells.append(f"{statistics.median(times) * 1e6:7.1f}")
        print(f"  {name:20s}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
