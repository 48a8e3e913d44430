"""Run `firsttoken bench` with every garbage collection over 2 ms of the client logged.

    python docs/bench/s15/gcprobe.py --no-progress --profile chat-8b --modes stack,direct \
        --concurrency 200 --requests 2000 --repeats 2

Prints (perf_counter s, generation, duration ms, objects collected) for each such pause.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

from firsttoken.bench import cli

pauses: list[tuple[float, int, float, int]] = []
_started = 0.0


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _started
    now = time.perf_counter()
    if phase == "start":
        _started = now
        return
    ms = (now - _started) * 1000
    if ms > 2:
        pauses.append((round(now, 3), info["generation"], round(ms, 1), info["collected"]))


if __name__ == "__main__":
    gc.callbacks.append(_on_gc)
    rc = cli.main(sys.argv[1:])
    print("GC pauses > 2 ms:", pauses)
    print("objects tracked at the end:", len(gc.get_objects()))
    sys.exit(rc)
