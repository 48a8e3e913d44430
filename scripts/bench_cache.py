"""End-to-end cache latency through the real stack: client sends `chat` -> `done` received.

    python scripts/bench_cache.py [--n 200] [--runs 3]

Starts the simulated engine, one gateway, one chat worker and a bulk worker (machine Redis and
PostgreSQL when they answer), seeds the cache with a few questions, then times sequential exact
hits (the same question again) and semantic hits (a paraphrase), each with a fresh chat id.
Prints one JSON line per run and the medians over runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np
import websockets

from firsttoken.bench.profiles import PROFILES
from firsttoken.bench.stack import BenchStack

SEEDS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("What payment methods do you accept?", "Which payment methods do you accept?"),
    ("How do I cancel my subscription?", "How can I cancel my subscription?"),
    ("What is the return policy?", "What's your return policy?"),
]


async def ask(ws: websockets.ClientConnection, chat_id: str, text: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    await ws.send(
        json.dumps({"type": "chat", "id": chat_id, "messages": [{"role": "user", "content": text}]})
    )
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("id") == chat_id and frame["type"] in ("done", "error"):
            return (time.perf_counter() - t0) * 1000, frame


async def one_run(url: str, key: str, n: int, run: int, verbose: bool = False) -> dict[str, float]:
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        for i, (seed, _) in enumerate(SEEDS):
            await ask(ws, f"seed{run}-{i}", seed)
        await asyncio.sleep(1.0)
        for i in range(20):  # warm-up: model loaded, connections pooled
            await ask(ws, f"w{run}-{i}", SEEDS[i % len(SEEDS)][1])
        out: dict[str, float] = {}
        for tier, pick in (("exact", 0), ("semantic", 1)):
            times, cache_ms = [], []
            stages: dict[str, list[float]] = {}
            for i in range(n):
                pair = SEEDS[i % len(SEEDS)]
                ms, done = await ask(ws, f"{tier}{run}-{i}", pair[pick])
                if not done.get("cached"):
                    raise RuntimeError(f"{tier} lookup missed: {done}")
                times.append(ms)
                cache_ms.append(done["timings"].get("cache_ms", 0.0))
                for name, value in done["timings"].items():
                    stages.setdefault(name, []).append(value)
            out[f"{tier}_p50_ms"] = round(statistics.median(times), 3)
            out[f"{tier}_p99_ms"] = round(float(np.percentile(times, 99)), 3)
            out[f"{tier}_worker_cache_ms_p50"] = round(statistics.median(cache_ms), 3)
            if verbose:
                print(tier, {k: round(statistics.median(v), 3) for k, v in stages.items()})
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="hits timed per tier per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stages", action="store_true", help="print the median of each timing")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a stack setting, e.g. --set embed_threads=1 (FIRSTTOKEN_EMBED_THREADS)",
    )
    args = ap.parse_args()
    profile = next(iter(PROFILES.values()))
    stack = BenchStack(profile, workers=1, worker_concurrency=64)
    # No per-key or per-tenant limits: this measures the cache, not admission control.
    stack.settings.update(
        key_rpm_default="0", tenant_rpm_default="0", key_tpm_default="0", tenant_tpm_default="0"
    )
    stack.settings.update(dict(item.split("=", 1) for item in args.set))
    try:
        stack.start_sim()
        stack.start_stack()
        runs = []
        for run in range(args.runs):
            result = asyncio.run(one_run(stack.ws_url, stack.api_key, args.n, run, args.stages))
            print(json.dumps({"run": run, **result}), flush=True)
            runs.append(result)
        print(
            json.dumps(
                {
                    "median_of_runs": {
                        k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]
                    },
                    "notes": stack.notes,
                }
            )
        )
    finally:
        stack.close()


if __name__ == "__main__":
    main()
