"""`firsttoken bench`: drive the same load through firsttoken, straight to the engine, through
the naive synchronous pattern and through a peer gateway, in one run, and report the
difference.

    python -m firsttoken.bench --profile chat-8b --modes stack,direct --concurrency 1,50,200 \
        --requests 400 --repeats 3 --json bench-out/foundation.json --plot bench-out/f.png

Both doors against the engine, in the public gateway comparison's shape (issue 43):

    python -m firsttoken.bench --profile on-the-bench --modes direct,stack,openai --interleave \
        --concurrency 1,32 --requests 192 --repeats 3

The Responses door against the Chat Completions door (issue 44), the same way:

    python -m firsttoken.bench --profile on-the-bench --modes direct,openai,responses \
        --interleave --concurrency 1,32 --requests 192 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import math
import os
import platform
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from firsttoken.bench.profiles import PROFILES, get_profile
from firsttoken.bench.stats import RequestResult, aggregate_runs, summarize_run

MODES = ("stack", "openai", "responses", "direct", "naive", "litellm")


class Client(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def send(self, prompt: str) -> RequestResult: ...


@dataclass(frozen=True)
class LoadPoint:
    label: str
    concurrency: int
    rate: float | None


def warmup_wave(warmup: int, point: LoadPoint, answer_s: float) -> int:
    """How many requests to send (and discard) before a measured run, at most one per stream
    at a time: at least as many as the run will have in flight, so that every connection it
    uses (the client's, and the stack's to the engine) is open before the clock starts, in
    every mode, and no request of the run waits for a TCP connect. A closed loop has
    `concurrency` in flight from its first wave; an open loop about `rate` x `answer_s` (Little's
    law, `answer_s` being the time one answer takes)."""
    if warmup <= 0:
        return 0
    if point.rate is None:
        return max(warmup, point.concurrency)
    return max(warmup, min(point.concurrency, math.ceil(point.rate * answer_s)))


def _csv(kind: type, text: str) -> list[Any]:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s") from exc


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--modes",
        default="stack,direct",
        type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
        help="comma-separated modes, run back to back at each load point: stack "
        "(through firsttoken's websocket gateway), openai (the same gateway's OpenAI door, "
        "POST /v1/chat/completions), responses (its Responses door, POST /v1/responses, "
        "streamed, store false), direct (the engine's OpenAI "
        "streaming API), naive (blocking request, then a sync DB write and a log "
        "line), litellm (the LiteLLM proxy in front of the same engine). "
        "Default: %(default)s",
    )
    p.add_argument(
        "--profile",
        default="chat-8b",
        choices=sorted(PROFILES),
        help="simulated engine timing: "
        + "; ".join(f"{n}: {pr.description}" for n, pr in PROFILES.items()),
    )
    p.add_argument(
        "--concurrency",
        default=[50],
        type=lambda s: _csv(int, s),
        help="closed loop: concurrent streams (virtual users sending back to back); "
        "a comma-separated list runs each load point in turn. Default: 50",
    )
    p.add_argument(
        "--rate",
        default=None,
        type=lambda s: _csv(float, s),
        help="open loop instead: Poisson arrivals per second (comma-separated list "
        "for a sweep); --max-in-flight caps requests in flight",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=2000,
        help="open loop: most requests in flight at once (default %(default)s)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per run (default: max(100, 4 x concurrency))",
    )
    g.add_argument(
        "--duration", type=float, default=None, help="seconds per run instead of a request count"
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="every mode in one run instead of back to back: each request goes by a mode drawn "
        "at random, so all modes share the machine's state; at each --concurrency N, rounds of "
        "N requests sent at once, each round waiting for its last answer (N=1: one request "
        "after another), --requests in all (issue 43; firsttoken/bench/interleave.py)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every mode at every load point (report medians and spread; "
        "use >= 3 for published numbers). Default: %(default)s",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="requests per mode before each measured run, discarded; a run sends at least as "
        "many as it will have in flight (a closed loop: one per stream), so every connection "
        "is open before the clock starts (default %(default)s; 0: none)",
    )
    p.add_argument(
        "--repeat-share",
        type=float,
        default=0.0,
        help="share of prompts that repeat an earlier prompt exactly (default 0)",
    )
    p.add_argument(
        "--paraphrase-share",
        type=float,
        default=0.0,
        help="share of prompts that reword an earlier prompt (default 0)",
    )
    p.add_argument(
        "--cache",
        choices=("on", "off"),
        default="off",
        help="the chat frame's cache flag in stack mode (default off: every request "
        "reaches the engine, so the modes are comparable)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="max_tokens per request (default: the profile's answer length)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="chat worker processes of the started stack (default %(default)s)",
    )
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway processes of the started stack, sharing one port (default %(default)s)",
    )
    p.add_argument(
        "--worker-concurrency",
        type=int,
        default=1024,
        help="concurrent chats per chat worker process (default %(default)s)",
    )
    p.add_argument(
        "--connections",
        type=int,
        default=None,
        help="stack mode: websocket connections (default: one per stream in a closed "
        "loop, 64 in an open loop; each carries up to 64 chats)",
    )
    p.add_argument(
        "--url",
        default=None,
        help="use a running gateway (ws://HOST:PORT/v1/ws) instead of starting a stack",
    )
    p.add_argument("--api-key", default=None, help="API key for --url")
    p.add_argument(
        "--engine-url",
        default=None,
        help="use a running OpenAI-compatible engine (http://HOST:PORT/v1) instead of "
        "starting the simulator; the profile is then only a label",
    )
    p.add_argument("--engine-model", default="sim", help="model name at the engine (default sim)")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="per-request client timeout, seconds (default %(default)s)",
    )
    p.add_argument(
        "--overhead-limit-ms",
        type=float,
        default=50.0,
        help="open-loop sweeps: the p99 added TTFT a rate may have to count as "
        "sustainable (default %(default)s)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=None,
        metavar="PCT",
        help="before each measured run, wait until at most PCT%% of the machine's CPU is busy "
        "(other work would show up as latency); the busy share seen is recorded per run",
    )
    p.add_argument(
        "--wait-idle-max",
        type=float,
        default=300.0,
        help="longest wait for --wait-idle, seconds; then run anyway (default %(default)s)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        dest="json_out",
        help="write the summaries, medians, added times and settings as JSON here",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a PNG (TTFT CDF and tokens/s over time, first repeat) here; "
        "needs matplotlib (the 'bench' extra; installed on demand)",
    )
    p.add_argument(
        "--keep-results", action="store_true", help="include every request's result in the JSON"
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the started processes' logs (the run's work dir, printed at the end)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="NAME=VALUE",
        help="a setting of the stack it starts, repeatable: --set cache_head_start_ms=8 is "
        "FIRSTTOKEN_CACHE_HEAD_START_MS=8 for its gateway and workers",
    )


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip().lower(), value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `bench` on the `firsttoken` command's subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="Benchmark the stack against the engine, the naive pattern and LiteLLM.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(fn=run)
    return p  # type: ignore[no-any-return]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="firsttoken bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    return p


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _load_points(args: argparse.Namespace) -> list[LoadPoint]:
    if args.rate:
        return [LoadPoint(f"rate={r:g}/s", args.max_in_flight, r) for r in args.rate]
    return [LoadPoint(f"c={c}", c, None) for c in args.concurrency]


class Bench:
    """One invocation: the processes, the clients, and every run's summary."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.profile = get_profile(args.profile)
        self.runs: list[dict[str, Any]] = []
        self.samples: dict[str, list[RequestResult]] = {}
        self.engine_url = args.engine_url or ""
        self.ws_url, self.api_key = args.url or "", args.api_key or ""
        self.stack: Any = None
        self.peer: Any = None
        self._model = ""  # the gateway's default model, for the HTTP doors' modes

    def start(self, exits: ExitStack) -> None:
        from firsttoken.bench.interleave import STACK_MODES
        from firsttoken.bench.stack import BenchStack

        a = self.args
        self.stack = BenchStack(
            self.profile,
            workers=a.workers,
            worker_concurrency=a.worker_concurrency,
            gateways=a.gateways,
        )
        self.stack.settings.update(dict(a.set))
        exits.callback(self.stack.close)
        if not self.engine_url:
            self.engine_url = self.stack.start_sim()
        if STACK_MODES & set(a.modes) and not self.ws_url:
            self.stack.start_stack()
            self.ws_url, self.api_key = self.stack.ws_url, self.stack.api_key
        if "litellm" in a.modes:
            from firsttoken.bench.peer import LiteLLMPeer

            self.peer = LiteLLMPeer(self.engine_url, self.stack.workdir, a.engine_model)
            exits.callback(self.peer.stop)
            self.peer.start()

    def client(self, mode: str, point: LoadPoint) -> Client:
        a = self.args
        max_tokens = a.max_tokens or self.profile.max_tokens
        streams = point.concurrency
        if mode == "stack":
            from firsttoken.bench.loadgen import StackClient

            conns = a.connections or (streams if point.rate is None else 64)
            return StackClient(
                self.ws_url,
                self.api_key,
                connections=min(conns, streams),
                max_tokens=max_tokens,
                cache=a.cache == "on",
                timeout_s=a.timeout,
            )
        if mode in ("openai", "responses"):
            from firsttoken.bench.direct import DirectClient
            from firsttoken.bench.sse import CHAT, RESPONSES
            from firsttoken.openaiclient import base_url

            url = base_url(self.ws_url)
            return DirectClient(
                url,
                model=self._gateway_model(url),
                api_key=self.api_key,
                max_tokens=max_tokens,
                connections=streams,
                timeout_s=a.timeout,
                # The stack mode's cache flag, so the doors are compared on one path.
                extra={"x_firsttoken": {"cache": a.cache == "on"}},
                door=RESPONSES if mode == "responses" else CHAT,
            )
        if mode in ("direct", "litellm"):
            from firsttoken.bench.direct import DirectClient

            if mode == "litellm":
                return DirectClient(
                    self.peer.base_url,
                    model=self.peer.model,
                    api_key=self.peer.master_key,
                    max_tokens=max_tokens,
                    connections=streams,
                    timeout_s=a.timeout,
                )
            return DirectClient(
                self.engine_url,
                model=a.engine_model,
                max_tokens=max_tokens,
                connections=streams,
                timeout_s=a.timeout,
            )
        if mode == "naive":
            from firsttoken.bench.naive import NaiveClient

            wd = self.stack.workdir
            return NaiveClient(
                self.engine_url,
                wd / "naive.sqlite3",
                wd / "naive.log",
                threads=min(streams, 512),
                model=a.engine_model,
                max_tokens=max_tokens,
                timeout_s=a.timeout,
            )
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")

    def _gateway_model(self, url: str) -> str:
        """The gateway's default model (the websocket mode's, which sends none)."""
        if not self._model:
            import openai

            from firsttoken.openaiclient import default_model

            # Closed after: an unclosed client's pooled socket is a ResourceWarning, whichever
            # test the collector meets it in.
            with openai.OpenAI(base_url=url, api_key=self.api_key) as client:
                self._model = default_model(client)
        return self._model

    async def _wait_idle(self) -> float:
        """The machine's busy share just before a run, after waiting for it to drop below
        --wait-idle (when given)."""
        from firsttoken.bench.stack import machine_busy_share

        limit = self.args.wait_idle
        deadline = time.monotonic() + self.args.wait_idle_max
        told = False
        while True:
            busy = await asyncio.to_thread(machine_busy_share, 1.0)
            if limit is None or math.isnan(busy) or busy * 100 <= limit:
                return busy
            if not told:  # a silent wait of minutes looks like a hang
                print(
                    f"  machine {busy:.0%} busy; waiting up to {self.args.wait_idle_max:.0f}s "
                    f"for <= {limit:g}% (--wait-idle)",
                    flush=True,
                )
                told = True
            if time.monotonic() > deadline:
                print(
                    f"  machine still {busy:.0%} busy after {self.args.wait_idle_max:.0f}s; "
                    "running anyway",
                    flush=True,
                )
                return busy
            await asyncio.sleep(2.0)

    def _pids(self) -> dict[str, int]:
        pids = self.stack.pids() if self.stack else {}
        if self.peer and self.peer.child:
            pids["litellm"] = self.peer.child.pid
        return pids

    async def one_run(self, mode: str, point: LoadPoint, repeat: int) -> dict[str, Any]:
        from firsttoken.bench.loadgen import Progress, PromptMix, drive
        from firsttoken.bench.stack import busy_share, cpu_seconds, machine_ticks

        a = self.args
        requests = a.requests if a.duration is None else None
        if requests is None and a.duration is None:
            requests = max(100, 4 * point.concurrency)
        client = self.client(mode, point)
        await client.open()
        try:
            # An answer's time by the profile (an estimate with --engine-url's engine).
            tokens = a.max_tokens or self.profile.max_tokens
            answer_s = (self.profile.ttft_ms + tokens * self.profile.itl_ms) / 1000
            warm = warmup_wave(a.warmup, point, answer_s)
            if warm:
                await drive(
                    client.send,
                    PromptMix(tag=f"warm{repeat}{mode}{point.label}x"),
                    concurrency=min(point.concurrency, warm),
                    requests=warm,
                )
            # The same seed and tag for every mode of a repeat: the same questions, so the
            # same answer lengths; a fresh tag per repeat keeps answer caches cold.
            mix = PromptMix(
                a.repeat_share, a.paraphrase_share, seed=repeat, tag=f"r{repeat}{point.label}-"
            )
            label = f"{mode} {point.label} #{repeat + 1}"
            progress = Progress(label, requests, enabled=not a.no_progress and sys.stderr.isatty())
            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
            # Everything this process holds so far (earlier runs' results, the stack's handles)
            # out of the collector's sight, as the stack's processes do (shared/heap.py): a full
            # collection of it would stop this client inside a run and count as the stack's time.
            gc.collect()
            gc.freeze()
            busy_before = await self._wait_idle()
            pids = self._pids()
            cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
            ticks0 = machine_ticks()
            outcome = await drive(
                client.send,
                mix,
                concurrency=point.concurrency,
                requests=requests,
                duration_s=a.duration,
                rate=point.rate,
                seed=repeat,
                progress=progress,
            )
            server_cpu = {n: (cpu_seconds(p) - cpu0[n]) / outcome.wall_s for n, p in pids.items()}
            busy_during = busy_share(ticks0, machine_ticks())
        finally:
            await client.close()
        # A closed loop starts every stream at once: that first wave is summarized apart too.
        first_wave = point.concurrency if point.rate is None else 0
        summary = summarize_run(outcome.results, outcome.wall_s, first_wave)
        run = {
            "mode": mode,
            "load": point.label,
            "concurrency": point.concurrency,
            "rate": point.rate,
            "repeat": repeat,
            "summary": summary,
            "client_cpu_share": outcome.client_cpu_share,
            "server_cpu_share": server_cpu,
            # Other work on the machine shows here: compare with the number of cores.
            "loadavg_1m_before": load_before,
            "machine_busy_before": busy_before,
            # Everything on the machine (Redis, PostgreSQL, the load generator included): near
            # 100%, every hop waits for a core and the added time is mostly that wait.
            "machine_busy": busy_during,
        }
        if a.keep_results:
            run["results"] = [dataclasses.asdict(r) for r in outcome.results]
        if repeat == 0:
            self.samples[f"{mode} {point.label}"] = outcome.results
        t = summary["ttft_ms"]
        cpu = " ".join(f"{n}={v:.0%}" for n, v in server_cpu.items() if not math.isnan(v))
        print(
            f"  {label}: {summary['ok']}/{summary['requests']} ok, {summary['errors']} errors "
            f"{summary['error_codes'] or ''}, TTFT p50 {t['p50']:.1f} p99 {t['p99']:.1f} ms, "
            f"{summary['tokens_per_s']:.0f} tok/s, {summary['qps']:.1f} req/s, "
            f"{summary['in_flight_mean']:.0f} streams in flight (mean), "
            f"client CPU {outcome.client_cpu_share:.0%}, machine busy before {busy_before:.0%}, "
            f"during {busy_during:.0%} "
            f"| {cpu}",
            flush=True,
        )
        return run

    async def run_all(self) -> None:
        modes = self.args.modes
        for point in _load_points(self.args):
            for repeat in range(self.args.repeats):
                if self.args.interleave:
                    from firsttoken.bench.interleave import interleaved_run

                    self.runs += await interleaved_run(self, point, repeat)
                    continue
                # Rotate the order so no mode always runs first (or right after another).
                k = repeat % len(modes)
                for mode in modes[k:] + modes[:k]:
                    self.runs.append(await self.one_run(mode, point, repeat))


def sustainable(
    agg: dict[str, Any], points: list[LoadPoint], limit_ms: float, mode: str = "stack"
) -> dict[str, Any]:
    """For an open-loop sweep: per rate, the p99 added TTFT; and the highest rate within limit."""
    from firsttoken.bench.stats import highest_sustainable

    table = []
    for p in points:
        entry = agg.get(p.label, {})
        over = entry.get("added_ttft_ms", {}).get(mode, {}).get("p99", {}).get("median", math.nan)
        errors = entry.get("modes", {}).get(mode, {}).get("errors", 1)
        table.append((p.rate or 0.0, over, errors == 0))
    return {
        "mode": mode,
        "limit_ms": limit_ms,
        "points": [{"rate": r, "p99_added_ms": o, "clean": c} for r, o, c in table],
        "highest_rate": highest_sustainable(table, limit_ms),
    }


def _command_line() -> str:
    import shlex

    argv = sys.argv[1:]
    if sys.argv[0].endswith("__main__.py"):
        return "python -m firsttoken.bench " + shlex.join(argv)
    return "firsttoken " + shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    from firsttoken.bench.report import plot, print_report, write_json

    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        print(
            f"firsttoken bench: unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}",
            file=sys.stderr,
        )
        return 2
    if args.gateways < 1:
        print(
            f"firsttoken bench: --gateways must be at least 1, not {args.gateways}", file=sys.stderr
        )
        return 2
    if args.interleave and (args.rate or args.duration is not None):
        print("firsttoken bench: --interleave takes --concurrency and --requests", file=sys.stderr)
        return 2
    if args.url and not args.api_key:
        print("firsttoken bench: --url needs --api-key", file=sys.stderr)
        return 2
    # SIGTERM (e.g. from `timeout`) must stop the children too. As KeyboardInterrupt: the event
    # loop lets that one through (an exception raised in a signal handler it would just log).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    bench = Bench(args)
    info = machine()
    print(
        f"firsttoken bench: profile {args.profile}, modes {','.join(args.modes)}, "
        f"{info['nproc']} CPUs ({info['cpu']})",
        flush=True,
    )
    t0 = time.monotonic()
    with ExitStack() as exits:
        try:
            bench.start(exits)
        except BaseException:
            if bench.stack:
                bench.stack.keep_workdir = True
                print(
                    f"firsttoken bench: start-up failed; logs in {bench.stack.workdir}",
                    file=sys.stderr,
                )
            raise
        try:
            import uvloop

            runner: Any = uvloop.run
        except ImportError:  # pragma: no cover
            runner = asyncio.run
        try:
            runner(bench.run_all())
        except BaseException:
            if bench.stack:
                bench.stack.keep_workdir = True
                print(
                    f"firsttoken bench: failed; process logs kept in {bench.stack.workdir}",
                    file=sys.stderr,
                )
            raise
        notes = list(bench.stack.notes) if bench.stack else []
        if bench.stack and args.keep_logs:
            bench.stack.keep_workdir = True
            notes.append(f"logs: {bench.stack.workdir}")
    agg = aggregate_runs(bench.runs)
    extra = []
    points = _load_points(args)
    sustain = None
    if args.rate and "direct" in args.modes and "stack" in args.modes:
        sustain = sustainable(agg, points, args.overhead_limit_ms)
        extra.append(
            f"\nhighest rate with stack p99 added TTFT <= {args.overhead_limit_ms:g} ms "
            f"and no errors: {sustain['highest_rate']} req/s"
        )
    print_report(agg, extra)
    settings = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "fn"
    }
    payload = {
        "machine": info,
        "command": _command_line(),
        "settings": settings,
        "profile": dataclasses.asdict(get_profile(args.profile)),
        "stack": {
            "workers": args.workers,
            "gateways": args.gateways,
            "worker_concurrency": args.worker_concurrency,
            "notes": notes,
        },
        "elapsed_s": time.monotonic() - t0,
        "aggregate": agg,
        "runs": bench.runs,
        "sustainable": sustain,
    }
    if args.json_out:
        write_json(args.json_out, payload)
        print(f"\nJSON: {args.json_out}")
    if args.plot:
        plot(args.plot, bench.samples, f"firsttoken bench, profile {args.profile}")
        print(f"plot: {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
