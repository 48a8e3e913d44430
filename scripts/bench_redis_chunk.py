"""Redis CPU per token chunk: the worker's Lua script (PUBLISH + XADD) against the two plain
commands, pipelined 20 at a time with a subscriber on the channel, read from `INFO cpu`.

    python scripts/bench_redis_chunk.py --chunks 20000 --repeats 3

Uses the machine's Redis (redis://127.0.0.1:6379/0, or --redis-url); the keys it writes are
removed at the end.
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.publish import SEND_LUA

CHUNK = b'T{"type":"token","id":"c1","seq":5,"text":" hello"}'


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--chunks", type=int, default=20000, help="chunks per measurement")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    r = redis.Redis.from_url(args.redis_url)
    name = f"ftchunk{uuid.uuid4().hex[:8]}"
    channel, stream = f"{name}:ch", f"{name}:st"
    sha = r.script_load(SEND_LUA)
    sub = redis.Redis.from_url(args.redis_url).pubsub()
    sub.subscribe(channel)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            sub.get_message(timeout=0.1)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def redis_cpu() -> float:
        info = r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    try:
        for repeat in range(args.repeats):
            for mode in ("lua", "plain"):
                before = redis_cpu()
                pipe = r.pipeline(transaction=False)
                for i in range(args.chunks):
                    if mode == "lua":
                        pipe.evalsha(sha, 2, channel, stream, CHUNK, "2000", "0")
                    else:
                        pipe.publish(channel, CHUNK)
                        pipe.xadd(stream, {"m": CHUNK}, maxlen=2000, approximate=True)
                    if i % 20 == 19:
                        pipe.execute()
                pipe.execute()
                spent = (redis_cpu() - before) / args.chunks * 1e6
                print(f"repeat {repeat + 1} {mode:5s}: {spent:.1f} us of Redis CPU per chunk")
    finally:
        stop.set()
        reader.join()
        r.delete(stream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
