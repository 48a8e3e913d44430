"""Interleaved runs (issue 43): every mode of a load point in one run, each request sent by a
mode drawn at random, so that all of them share the machine's state (its other work, its
caches, the stack's idle or busy processes) instead of taking turns at it.

The shape is the public "On the Bench" gateway comparison's: at one stream, requests one after
another; at N streams, rounds of N requests sent at once, each round waiting for its last answer
before the next starts (a burst, not a closed loop that drifts out of step). "At once": one
after another in the round's random order, each written out before the next starts (two passes
of the load generator's event loop apart, well under a millisecond each), so that no mode's
requests reach their server ahead of another's.

The draw is pure (`plan`) and unit-tested; `drive_interleaved` is the driver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from firsttoken.bench.loadgen import Progress, PromptMix, RunOutcome, Sender
from firsttoken.bench.stats import (
    ENGINE_PROCESS,
    RequestResult,
    is_stack_process,
    summarize_run,
)


def plan(modes: Sequence[str], streams: int, rounds: int, seed: int) -> list[list[str]]:
    """The mode of every request, round by round: `rounds` rounds of `streams` requests. Every
    mode gets the same number of requests (up to one, where they do not divide evenly) and
    its requests are spread at random over the rounds and the places within a round, so no
    mode always goes first or always shares a round with the same others."""
    if not modes:
        raise ValueError("give at least one mode")
    if streams < 1 or rounds < 0:
        raise ValueError("streams must be at least 1 and rounds not negative")
    rng = random.Random(seed)
    total = streams * rounds
    # Which modes get the remainder changes with the seed.
    offset = rng.randrange(len(modes))
    draw = [modes[(i + offset) % len(modes)] for i in range(total)]
    rng.shuffle(draw)
    return [draw[r * streams : (r + 1) * streams] for r in range(rounds)]


def rounds_for(requests: int, streams: int, modes: int) -> int:
    """Rounds of a burst run that send at least `requests` requests in all, and at least two
    requests of every mode per round-set (so that each mode has a p99 of more than one)."""
    if streams < 1 or modes < 1:
        raise ValueError("streams and modes must be at least 1")
    return max(1, math.ceil(max(requests, 2 * modes) / streams))


async def drive_interleaved(
    senders: Mapping[str, Sender],
    mix: PromptMix,
    *,
    streams: int,
    rounds: int,
    seed: int = 11,
    progress: Progress | None = None,
) -> tuple[dict[str, RunOutcome], float, float]:
    """Send `rounds` rounds of `streams` requests at once, each by its planned mode. Returns
    each mode's outcome (its results; wall and client CPU are the whole run's), the run's
    wall time and the client's CPU seconds."""
    by_mode: dict[str, list[RequestResult]] = {m: [] for m in senders}
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def one(mode: str) -> None:
        result = await senders[mode](mix.next())
        result.start_s -= t0
        by_mode[mode].append(result)
        if progress:
            progress.tick(result)

    for modes in plan(list(senders), streams, rounds, seed):
        sent = []
        for m in modes:
            sent.append(asyncio.ensure_future(one(m)))
            # Each request's bytes out before the next starts: aiohttp (on Python < 3.12)
            # writes a request's body from a task of its own, which a burst of coroutines
            # started together would put behind every other request's first step, so the HTTP
            # modes' requests reached their servers milliseconds after the websocket's frames
            # and the HTTP door's chats queued behind them. Two passes of the loop each: the
            # request's first step, then its body's writer.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*sent)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if progress:
        progress.close()
    outcomes = {
        m: RunOutcome(sorted(rs, key=lambda r: r.start_s), wall, cpu) for m, rs in by_mode.items()
    }
    return outcomes, wall, cpu


# The modes through the stack's gateway: its websocket and its two HTTP doors.
STACK_MODES = frozenset({"stack", "openai", "responses"})


def shared_cpu_share(
    cpu_s: Mapping[str, float], wall_s: float, ok: Mapping[str, int], mode: str
) -> dict[str, float]:
    """One mode's share of the processes' CPU in an interleaved run, as a share of a core over
    the run (what a run of that mode alone records, so that stats.cpu_ms_per_request reads the
    same): the engine's CPU is split over every answered request, the stack's processes'
    (gateway, workers, Redis) over the requests through any door of the stack, a peer's
    over its own. Every door's requests share the stack's cost at its mean per request."""
    if wall_s <= 0:
        return {}
    out: dict[str, float] = {}
    for name, seconds in cpu_s.items():
        if math.isnan(seconds):
            continue
        if name == ENGINE_PROCESS:
            users = set(ok)
        elif is_stack_process(name):
            users = set(ok) & STACK_MODES
        else:
            users = {name}
        if mode not in users:
            continue
        pool = sum(ok[m] for m in users if m in ok)
        out[name] = seconds * (ok[mode] / pool if pool else 0.0) / wall_s
    return out


async def interleaved_run(bench: Any, point: Any, repeat: int) -> list[dict[str, Any]]:
    """One repeat of an interleaved load point (firsttoken/bench/cli.py's `Bench`, --interleave):
    every mode's client open at once, a warm-up round of each, then the planned rounds; one run
    record per mode, shaped as a run of that mode alone (its summary, its share of the CPU), so
    that stats.aggregate_runs and the report take them as they are."""
    from firsttoken.bench.stack import busy_share, cpu_seconds, machine_ticks

    a = bench.args
    modes: list[str] = list(a.modes)
    clients = {m: bench.client(m, point) for m in modes}
    for c in clients.values():
        await c.open()
    try:
        senders = {m: c.send for m, c in clients.items()}
        # Every connection of every mode open (one per stream) before the clock starts.
        warm = max(a.warmup, point.concurrency)
        if warm:
            warm_mix = PromptMix(tag=f"warm{repeat}{point.label}x")
            await drive_interleaved(
                senders,
                warm_mix,
                streams=point.concurrency,
                rounds=max(1, math.ceil(warm * len(modes) / point.concurrency)),
                seed=1000 + repeat,
            )
        requests = a.requests or max(100, 4 * point.concurrency)
        rounds = rounds_for(requests, point.concurrency, len(modes))
        mix = PromptMix(
            a.repeat_share, a.paraphrase_share, seed=repeat, tag=f"r{repeat}{point.label}-"
        )
        label = f"{'+'.join(modes)} interleaved {point.label} #{repeat + 1}"
        progress = Progress(
            label, rounds * point.concurrency, enabled=not a.no_progress and sys.stderr.isatty()
        )
        gc.collect()
        gc.freeze()
        busy_before = await bench._wait_idle()
        pids = bench._pids()
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        ticks0 = machine_ticks()
        outcomes, wall, client_cpu = await drive_interleaved(
            senders, mix, streams=point.concurrency, rounds=rounds, seed=repeat, progress=progress
        )
        cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
        busy_during = busy_share(ticks0, machine_ticks())
    finally:
        for c in clients.values():
            await c.close()
    ok = {m: sum(1 for r in o.results if r.ok) for m, o in outcomes.items()}
    runs = []
    for mode, outcome in outcomes.items():
        summary = summarize_run(outcome.results, wall)
        runs.append(
            {
                "mode": mode,
                "load": point.label,
                "concurrency": point.concurrency,
                "rate": None,
                "repeat": repeat,
                "interleaved": True,
                "summary": summary,
                # The load generator's CPU and the processes' are the whole run's, split over
                # the requests that used them (shared_cpu_share).
                "client_cpu_share": client_cpu / wall * ok[mode] / max(1, sum(ok.values())),
                "server_cpu_share": shared_cpu_share(cpu, wall, ok, mode),
                "machine_busy_before": busy_before,
                "machine_busy": busy_during,
            }
        )
        if a.keep_results:
            runs[-1]["results"] = [dataclasses.asdict(r) for r in outcome.results]
        if repeat == 0:
            bench.samples[f"{mode} {point.label}"] = outcome.results
        t, g = summary["ttft_ms"], summary["gap_ms"]
        stages = summary["server_stages_ms"]
        hops = " ".join(
            f"{k.removesuffix('_ms')} {v['p50']:.2f}/{v['p99']:.2f}"
            for k, v in stages.items()
            if k not in ("ttft_ms", "total_ms")
        )
        print(
            f"  {mode} {point.label} #{repeat + 1} (interleaved): {summary['ok']}/"
            f"{summary['requests']} ok, TTFT p50 {t['p50']:.2f} p99 {t['p99']:.2f} ms, gap p50 "
            f"{g['p50']:.2f} p99 {g['p99']:.2f} ms, machine busy before {busy_before:.0%}, "
            f"during {busy_during:.0%}" + (f" | hops p50/p99 ms: {hops}" if hops else ""),
            flush=True,
        )
    return runs
