"""The relay bench: tokens/s one gateway process relays, with producers that are not the chat
workers (issue 7: ">= 20,000 tokens/s relayed by one gateway process").

    python -m firsttoken.bench.relaythroughput --streams 300 --tokens 256 --token-rate 100 \\
        --tokens-per-frame 1,4 --duration 10 --repeats 3 --json out.json

It starts one gateway and `--producers` processes of firsttoken/bench/producer.py in place of
the chat workers (no engine, no Celery, no bulk worker): they take each chat job off the chat
queue and publish what a chat worker publishes (`started`, the token chunks, `done`) to the
job's channel and replay stream, at `--token-rate` tokens/s per stream, `--tokens-per-frame`
tokens per chunk. The websocket load generator (firsttoken/bench/loadgen.py, closed loop:
`--streams` users sending back to back) drives the gateway from this process.

Reported per run: tokens/s and token frames/s delivered to the clients, and each process's CPU
as a share of one core (gateway, producers, this load generator, Redis) plus how busy the whole
machine was, so the table shows which process is the limit. The offered load is
streams x token rate; when the gateway keeps up, delivered ~= offered.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firsttoken.bench.producer import Shape
from firsttoken.bench.stats import RequestResult, markdown_table, percentile

TARGET_TOKENS_PER_S = 20_000.0


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError("expected comma-separated numbers") from exc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m firsttoken.bench.relaythroughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--streams",
        type=int,
        default=300,
        help="closed loop: concurrent streams, one websocket each (default %(default)s)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=256,
        help="tokens per answer (the chat frame's max_tokens; default %(default)s)",
    )
    p.add_argument(
        "--token-rate",
        type=_floats,
        default=[100.0],
        help="tokens/s per stream; a comma-separated list runs each in turn (default 100)",
    )
    p.add_argument(
        "--tokens-per-frame",
        type=_floats,
        default=[1.0, 4.0],
        help="tokens per token frame (>= 1; fractions spread, e.g. 1.3); "
        "comma-separated list (default 1,4)",
    )
    p.add_argument(
        "--producers", type=int, default=2, help="producer processes (default %(default)s)"
    )
    p.add_argument(
        "--tick-ms", type=float, default=2.0, help="producer scheduler tick (default %(default)s)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds per measured run (default %(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="seconds of discarded load before each run (default %(default)s)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per load point (default 3)")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        dest="py_spy",
        help="record the gateway with py-spy (raw collapsed stacks) during the "
        "first repeat of each load point, into this folder",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        dest="json_out",
        help="write every run and the medians here",
    )
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="JSON",
        help="print the table of an earlier run's --json file and exit (runs nothing)",
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the processes' logs (the work dir is printed)",
    )
    return p


def delivered_until(
    results: list[RequestResult], end_s: float, tokens: int, shape: Shape
) -> tuple[int, int]:
    """(token frames, tokens) the clients had received by ``end_s`` (seconds from the run's
    start): each frame's arrival is its request's start + TTFT + the gaps before it, and the
    producer's framing says how many tokens each frame carried."""
    sizes = shape.frame_sizes(tokens)
    frames = toks = 0
    for r in results:
        if r.ttft_ms is None:
            continue
        at = r.start_s + r.ttft_ms / 1000.0
        n = 0
        if at <= end_s:
            n = 1
            for gap in r.gaps_ms:
                at += gap / 1000.0
                if at > end_s:
                    break
                n += 1
        frames += n
        toks += sum(sizes[:n])
    return frames, toks


@dataclass
class Window:
    at: float  # perf_counter when sampled
    cpu: dict[str, float]  # share of one core per process over the window
    client: float
    machine_busy: float


async def _sample_after(seconds: float, pids: dict[str, int]) -> Window:
    """CPU of every process (and of this one, the load generator) over the next `seconds`."""
    from firsttoken.bench.stack import busy_share, cpu_seconds, machine_ticks

    t0, own0, m0 = time.perf_counter(), time.process_time(), machine_ticks()
    cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
    await asyncio.sleep(seconds)
    t1, own1, m1 = time.perf_counter(), time.process_time(), machine_ticks()
    span = t1 - t0
    return Window(
        at=t1,
        cpu={n: (cpu_seconds(p) - cpu0[n]) / span for n, p in pids.items()},
        client=(own1 - own0) / span,
        machine_busy=busy_share(m0, m1),
    )


class RelayBench:
    def __init__(self, args: argparse.Namespace) -> None:
        from firsttoken.bench.stack import BenchStack

        self.args = args
        self.stack = BenchStack(
            None,
            workers=0,
            settings={"max_tokens_limit": str(max(4096, args.tokens))},
        )
        self.runs: list[dict[str, Any]] = []

    def start(self) -> None:
        a = self.args
        consumers = {
            f"producer{i}": [
                "-m",
                "firsttoken.bench.producer",
                "--name",
                f"relay{i}-{self.stack.prefix}",
                "--tick-ms",
                str(a.tick_ms),
            ]
            for i in range(a.producers)
        }
        self.stack.start_stack(chat_consumers=consumers)

    def set_shape(self, token_rate: float, tokens_per_frame: float) -> None:
        import redis

        from firsttoken.bench.producer import config_key
        from shared.keys import Keys
        from shared.redis.client import master_url

        client = redis.Redis.from_url(master_url(self.stack.redis_url))
        client.hset(
            config_key(Keys(self.stack.prefix)),
            mapping={"token_rate": token_rate, "tokens_per_frame": tokens_per_frame},
        )
        client.close()
        time.sleep(0.6)  # producers re-read it every 0.25 s

    def _pids(self) -> dict[str, int]:
        return self.stack.pids()

    def _py_spy(self, label: str) -> subprocess.Popen[bytes] | None:
        if self.args.py_spy is None:
            return None
        self.args.py_spy.mkdir(parents=True, exist_ok=True)
        out = self.args.py_spy / f"gateway-{label}.pyspy.txt"
        seconds = max(1, int(self.args.duration) - 1)
        return subprocess.Popen(
            [
                "py-spy",
                "record",
                "-p",
                str(self.stack.procs["gateway"].pid),
                "-d",
                str(seconds),
                "-r",
                "100",
                "--format",
                "raw",
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def one_run(self, rate: float, k: float, repeat: int) -> dict[str, Any]:
        from firsttoken.bench.loadgen import PromptMix, StackClient, drive

        a = self.args
        client = StackClient(
            self.stack.ws_url,
            self.stack.api_key,
            connections=a.streams,
            max_tokens=a.tokens,
            cache=False,
            timeout_s=60.0,
        )
        await client.open()
        label = f"rate{rate:g}-k{k:g}"
        try:
            if a.warmup > 0:
                await drive(
                    client.send,
                    PromptMix(tag=f"w{repeat}{label}"),
                    concurrency=a.streams,
                    duration_s=a.warmup,
                )
            pids = self._pids()
            spy = self._py_spy(label) if repeat == 0 else None
            # The window is the first `duration` seconds of the run, while every stream is
            # busy; CPU and delivered frames are both counted over it (not over the tail,
            # when the last answers finish and the load thins out).
            sampler = asyncio.create_task(_sample_after(a.duration, pids))
            t0 = time.perf_counter()
            outcome = await drive(
                client.send,
                PromptMix(seed=repeat, tag=f"r{repeat}{label}"),
                concurrency=a.streams,
                duration_s=a.duration,
            )
            window = await sampler
            if spy is not None:
                spy.wait(30)
        finally:
            await client.close()
        # drive() made start_s relative to its own start, a hair after t0.
        end_s = window.at - t0
        frames, tokens = delivered_until(outcome.results, end_s, a.tokens, Shape(rate, k))
        ok = [r for r in outcome.results if r.ok]
        errors: dict[str, int] = {}
        for r in outcome.results:
            if r.error is not None:
                errors[r.error] = errors.get(r.error, 0) + 1
        cpu = window.cpu
        producers = {n: v for n, v in cpu.items() if n.startswith("producer")}
        run = {
            "token_rate": rate,
            "tokens_per_frame": k,
            "repeat": repeat,
            "streams": a.streams,
            "offered_tokens_per_s": a.streams * rate if rate > 0 else math.inf,
            "window_s": end_s,
            "wall_s": outcome.wall_s,
            "requests": len(outcome.results),
            "ok": len(ok),
            "errors": errors,
            "tokens": tokens,
            "frames": frames,
            "tokens_per_s": tokens / end_s,
            "frames_per_s": frames / end_s,
            # Whole-run figures (the tail included), from the `done` frames' usage.
            "tokens_per_s_whole_run": sum(r.tokens for r in ok) / outcome.wall_s,
            "ttft_ms_p50": percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], 50),
            "ttft_ms_p99": percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], 99),
            "gap_ms_p99": percentile([g for r in ok for g in r.gaps_ms], 99),
            "cpu": {
                "gateway": cpu.get("gateway", math.nan),
                "producers": sum(producers.values()),
                "producer_each": producers,
                "client": window.client,
                "redis": cpu.get("redis", math.nan),
            },
            "machine_busy": window.machine_busy,
            # Cores busy with anything but this bench's processes (other users' work).
            "other_cpu": window.machine_busy * _ncpu()
            - sum(v for v in cpu.values())
            - window.client,
        }
        c = run["cpu"]
        print(
            f"  rate {rate:g} tok/s/stream x {a.streams} streams, {k:g} tok/frame #{repeat + 1}: "
            f"{run['tokens_per_s']:.0f} tok/s, {run['frames_per_s']:.0f} frames/s, "
            f"{len(ok)}/{len(outcome.results)} ok {errors or ''}, TTFT p50 "
            f"{run['ttft_ms_p50']:.1f} ms | CPU gateway {c['gateway']:.0%} producers "
            f"{c['producers']:.0%} client {c['client']:.0%} redis {c['redis']:.0%} "
            f"other {run['other_cpu']:.0%}; machine {run['machine_busy']:.0%} of {_ncpu()} cores",
            flush=True,
        )
        return run

    async def run_all(self) -> None:
        for k in self.args.tokens_per_frame:
            for rate in self.args.token_rate:
                self.set_shape(rate, k)
                for repeat in range(self.args.repeats):
                    self.runs.append(await self.one_run(rate, k, repeat))


def _ncpu() -> int:
    import os

    return os.cpu_count() or 1


def _med(values: list[float]) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "-"
    med = statistics.median(vals)
    return f"{med:,.0f} ({min(vals):,.0f}..{max(vals):,.0f})" if len(vals) > 1 else f"{med:,.0f}"


def _pct(values: list[float]) -> str:
    vals = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(vals):.0%}" if vals else "-"


def summary(runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Medians over repeats per load point: the Markdown table and the rows as data."""
    points: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for r in runs:
        points.setdefault((r["tokens_per_frame"], r["token_rate"]), []).append(r)
    header = [
        "tokens/frame",
        "offered tok/s",
        "tokens/s delivered",
        "frames/s",
        "vs 20k target",
        "gateway CPU",
        "producers CPU",
        "client CPU",
        "redis CPU",
        "other work CPU",
        "machine busy",
        "errors",
        "TTFT p50 ms",
    ]
    rows, data = [], []
    for (k, rate), rs in points.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        row = {
            "tokens_per_frame": k,
            "token_rate": rate,
            "repeats": len(rs),
            "tokens_per_s_median": tps,
            "frames_per_s_median": statistics.median(r["frames_per_s"] for r in rs),
            "ratio_to_target": tps / TARGET_TOKENS_PER_S,
        }
        data.append(row)
        rows.append(
            [
                f"{k:g}",
                f"{rs[0]['offered_tokens_per_s']:,.0f}",
                _med([r["tokens_per_s"] for r in rs]),
                _med([r["frames_per_s"] for r in rs]),
                f"{row['ratio_to_target']:.2f}x",
                _pct([r["cpu"]["gateway"] for r in rs]),
                _pct([r["cpu"]["producers"] for r in rs]),
                _pct([r["cpu"]["client"] for r in rs]),
                _pct([r["cpu"]["redis"] for r in rs]),
                _pct([r["other_cpu"] for r in rs]),
                _pct([r["machine_busy"] for r in rs]),
                sum(sum(r["errors"].values()) for r in rs),
                f"{statistics.median(r['ttft_ms_p50'] for r in rs):.1f}",
            ]
        )
    return markdown_table(header, rows), data


def run(args: argparse.Namespace) -> int:
    import shlex

    from firsttoken.bench.cli import machine
    from firsttoken.bench.report import write_json

    if args.report is not None:
        import json

        print(summary(json.loads(args.report.read_text())["runs"])[0])
        return 0
    if any(k < 1 for k in args.tokens_per_frame):
        print("relay bench: --tokens-per-frame must be >= 1", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    bench = RelayBench(args)
    info = machine()
    print(
        f"relay bench: {args.producers} producers, {args.streams} streams, {args.tokens}-token "
        f"answers, {info['nproc']} CPUs ({info['cpu']})",
        flush=True,
    )
    try:
        bench.start()
        try:
            import uvloop

            runner: Any = uvloop.run
        except ImportError:  # pragma: no cover
            runner = asyncio.run
        runner(bench.run_all())
    except BaseException:
        bench.stack.keep_workdir = True
        print(f"relay bench: failed; process logs kept in {bench.stack.workdir}", file=sys.stderr)
        raise
    finally:
        if args.keep_logs:
            bench.stack.keep_workdir = True
            print(f"logs: {bench.stack.workdir}")
        bench.stack.close()
    table, rows = summary(bench.runs)
    print(
        "\nTokens/s relayed by one gateway process (median (min..max) over repeats; CPU as a "
        "share of one core, medians)\n"
    )
    print(table)
    if args.json_out:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        write_json(
            args.json_out,
            {
                "machine": info,
                "command": "python -m firsttoken.bench.relaythroughput " + shlex.join(sys.argv[1:]),
                "settings": settings,
                "notes": bench.stack.notes,
                "summary": rows,
                "runs": bench.runs,
            },
        )
        print(f"\nJSON: {args.json_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
