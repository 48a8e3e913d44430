"""Chats/s with one and with two chat-worker hosts, the engine's capacity fixed per host.

    python bench/hosts.py --capacity 16 --seconds 20 --repeats 3

Brings up the cluster test bed (tests/cluster/bed.py: hosts as network namespaces, HAProxy in
front of two gateways, Redis with Sentinels; needs root, haproxy, redis-sentinel and
PostgreSQL) with a simulated engine on each chat-worker host that generates at most
`--capacity` answers at once (`--max-seqs`; more wait, as on a GPU). Per repeat, a closed loop
through HAProxy with `concurrency` = hosts x capacity (each host's engine exactly full):

- 2 hosts at 2 x capacity;
- chat2's host killed: 1 host at capacity, and at 2 x capacity (twice the load one host's
  engine holds: its TTFT shows the queue);
- chat2 started again for the next repeat.

Prints chats/s and client TTFT p50/p99 (after the first wave) per point and repeat, and the
medians; `--json FILE` keeps the raw summaries (not committed: docs/benchmarks.md has the
figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from firsttoken.bench.loadgen import PromptMix, StackClient, drive
from firsttoken.bench.stats import summarize_run
from tests.cluster.bed import Bed, bring_up
from tests.integration.conftest import _migrate_and_key
from tests.support import postgres_database


async def _point(bed: Bed, concurrency: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    client = StackClient(bed.ws_url, bed.stack.api_key, connections=concurrency,
                         max_tokens=max_tokens, cache=False)  # fmt: skip
    await client.open()
    try:
        mix = PromptMix(tag=uuid.uuid4().hex[:6])
        outcome = await drive(client.send, mix, concurrency=concurrency, duration_s=seconds)
    finally:
        await client.close()
    run = summarize_run(outcome.results, outcome.wall_s, first_wave=concurrency)
    run["client_cpu_share"] = outcome.client_cpu_share
    return run


def _row(label: str, run: dict[str, Any]) -> str:
    ttft = run["ttft_after_first_wave_ms"]
    return (f"{label:28} {run['qps']:7.1f} chats/s  ttft p50 {ttft['p50']:6.0f} ms  "
            f"p99 {ttft['p99']:6.0f} ms  errors {run['error_codes'] or 0}  "
            f"client cpu {run['client_cpu_share']:.2f}")  # fmt: skip


def _run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    sim = ("--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--max-tokens",
           str(args.max_tokens), "--max-seqs", str(args.capacity))  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="firsttoken-bench-hosts-"))
    with postgres_database() as database_url:
        key = _migrate_and_key(database_url)
        # The bed's short test deadlines would cut a queue of twice one engine's capacity.
        loose = {"queue_deadline_s": "60", "stream_idle_timeout_s": "30"}
        # The key's default limits (600 chats a minute) would cap the very thing measured.
        for limit in ("key_rpm", "key_tpm", "key_max_streams", "tenant_rpm", "tenant_tpm"):
            loose[f"{limit}_default"] = "0"
        if args.match_concurrency:
            # A worker then takes no more chats than its host's engine generates at once,
            # and the shared queue hands the rest to the other host.
            loose["chat_concurrency"] = str(args.capacity)
        bed = bring_up(workdir, database_url, key, sim_args=sim, settings=loose)
        try:
            return asyncio.run(_measure(bed, args))
        finally:
            bed.close()


async def _measure(bed: Bed, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    cap = args.capacity
    points: dict[str, list[dict[str, Any]]] = {}
    await _point(bed, 2 * cap, min(5.0, args.seconds), args.max_tokens)  # warm-up
    plan = [("2 hosts", 2 * cap), ("1 host", cap), ("1 host, 2x its capacity", 2 * cap)]
    for repeat in range(args.repeats):
        for label, concurrency in plan:
            if label.startswith("1 host") and "chat2" not in bed.down:
                bed.kill_host("chat2")
            run = await _point(bed, concurrency, args.seconds, args.max_tokens)
            run["concurrency"] = concurrency
            points.setdefault(f"{label} @ {concurrency}", []).append(run)
            print(_row(f"{label} @ {concurrency} #{repeat + 1}", run), flush=True)
        if repeat + 1 < args.repeats:
            await asyncio.to_thread(bed.start_chat_host, "chat2")
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=16, help="answers one host's engine "
                        "generates at once (the simulator's --max-seqs)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each point")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every point")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="the engine's TTFT")
    parser.add_argument("--itl-ms", type=float, default=40.0, help="the engine's inter-token ms")
    parser.add_argument("--match-concurrency", action="store_true", help="set each chat "
                        "worker's FIRSTTOKEN_CHAT_CONCURRENCY to --capacity")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the raw summaries here")
    args = parser.parse_args()
    points = _run(args)
    print("\nmedians over repeats:")
    for label, runs in points.items():
        qps = statistics.median(r["qps"] for r in runs)
        p50 = statistics.median(r["ttft_after_first_wave_ms"]["p50"] for r in runs)
        p99 = statistics.median(r["ttft_after_first_wave_ms"]["p99"] for r in runs)
        print(f"  {label:30} {qps:7.1f} chats/s  ttft p50 {p50:6.0f} ms  p99 {p99:6.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(points, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
