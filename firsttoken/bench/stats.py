"""Pure arithmetic over bench results: percentiles, summaries, throughput timelines, tables.

No I/O and no clocks: every function takes values and returns values, so it is unit-tested
directly (tests/unit/firsttoken/test_bench_stats.py).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestResult:
    """What one request did, as the client saw it. Times in ms, ``start_s`` from run start."""

    start_s: float
    ttft_ms: float | None = None
    total_ms: float | None = None
    # Gaps between consecutive content deliveries (token frames or SSE chunks). The stack
    # coalesces tokens into chunks, so its gaps are fewer and larger than the engine's.
    gaps_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    chars: int = 0
    cached: bool = False
    error: str | None = None
    server_timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_ms is not None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default method). NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, min, p50, p90, p99, max of a sample (NaN fields when it is empty)."""
    out: dict[str, float] = {"n": float(len(values))}
    out["mean"] = statistics.fmean(values) if values else math.nan
    out["min"] = min(values) if values else math.nan
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    out["max"] = max(values) if values else math.nan
    return out


def summarize_run(
    results: Sequence[RequestResult], wall_s: float, first_wave: int = 0
) -> dict[str, Any]:
    """The summary of one run of one mode at one load point.

    `first_wave`: in a closed loop, the requests every stream sends at the same instant when
    the run starts (its concurrency). Their first tokens are also summarized apart, and
    `ttft_after_first_wave_ms` covers the rest: the steady state."""
    ok = [r for r in results if r.ok]
    by_start = sorted(ok, key=lambda r: r.start_s)
    wave, steady = by_start[:first_wave], by_start[first_wave:]
    errors = Counter(r.error for r in results if r.error is not None)
    tokens = sum(r.tokens for r in ok)
    gaps = [g for r in ok for g in r.gaps_ms]
    queue = [r.server_timings["queue_ms"] for r in ok if "queue_ms" in r.server_timings]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_codes": dict(errors),
        "cached": sum(1 for r in ok if r.cached),
        "wall_s": wall_s,
        "qps": len(ok) / wall_s if wall_s > 0 else math.nan,
        # Streams open on average over the run (Little's law: the answers' total time over
        # the wall time): an open loop's rate in concurrent streams.
        "in_flight_mean": (
            sum(r.total_ms for r in ok if r.total_ms is not None) / 1000 / wall_s
            if wall_s > 0
            else math.nan
        ),
        "tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else math.nan,
        "ttft_ms": summarize([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "first_wave": len(wave),
        "ttft_first_wave_ms": summarize([r.ttft_ms for r in wave if r.ttft_ms is not None]),
        "ttft_after_first_wave_ms": summarize([r.ttft_ms for r in steady if r.ttft_ms is not None]),
        "total_ms": summarize([r.total_ms for r in ok if r.total_ms is not None]),
        "gap_ms": summarize(gaps),
        "server_queue_ms": summarize(queue),
        # The stack's own stage timings (from its `done` frames), p50 and p99 of each stage.
        "server_stages_ms": {
            key: {f"p{q}": percentile(vals, q) for q in (50, 99)}
            for key, vals in _stages(ok).items()
        },
    }


def _stages(results: Sequence[RequestResult]) -> dict[str, list[float]]:
    stages: dict[str, list[float]] = {}
    for r in results:
        for key, value in r.server_timings.items():
            if isinstance(value, int | float):
                stages.setdefault(key, []).append(float(value))
    return stages


def added(
    run: Mapping[str, Any], baseline: Mapping[str, Any], metric: str = "ttft_ms"
) -> dict[str, float]:
    """Per-percentile difference of one metric between a run and its baseline
    (e.g. stack minus direct: the time the stack adds)."""
    return {f"p{q}": run[metric][f"p{q}"] - baseline[metric][f"p{q}"] for q in PERCENTILES}


def median_and_spread(values: Iterable[float]) -> dict[str, float]:
    """Median of repeated measurements, with their min and max (the spread)."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0.0}
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": float(len(vals)),
    }


# The simulated engine's name in a run's CPU table (a remote engine's CPU is not measured).
ENGINE_PROCESS = "sim"


def is_stack_process(name: str) -> bool:
    """Whether a process of a run's CPU table is the stack's own (gateway, workers, Redis),
    not the engine, a peer or the load generator."""
    return name == "redis" or name.startswith(("gateway", "worker"))


def cpu_ms_per_request(run: Mapping[str, Any]) -> dict[str, float]:
    """CPU milliseconds per answered request: each process of the run, the load generator
    ("client") and the stack's own processes together ("stack"). Shares of a core are a
    machine's speed as much as the code's; per request, in units of the engine's own cost in
    the same run (see aggregate_runs), they compare across runs and machines."""
    summary = run["summary"]
    ok, wall_s = summary["ok"], summary["wall_s"]
    if not ok:
        return {}
    per = {
        name: share * wall_s * 1000.0 / ok
        for name, share in run.get("server_cpu_share", {}).items()
        if share is not None and not math.isnan(share)
    }
    per["client"] = run.get("client_cpu_share", math.nan) * wall_s * 1000.0 / ok
    per["stack"] = sum(v for name, v in per.items() if is_stack_process(name))
    return per


def timeline(results: Sequence[RequestResult], bin_s: float = 1.0) -> list[dict[str, float]]:
    """Throughput over time: per bin, tokens/s (each request's tokens spread evenly between its
    first token and its end), completions/s and errors/s."""
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    ends = [r.start_s + (r.total_ms or 0) / 1000 for r in results]
    if not results:
        return []
    nbins = max(1, math.ceil(max(ends) / bin_s))
    tokens = [0.0] * nbins
    done = [0] * nbins
    errs = [0] * nbins
    for r, end in zip(results, ends, strict=True):
        idx = min(int(end / bin_s), nbins - 1)
        if not r.ok:
            errs[idx] += 1
            continue
        done[idx] += 1
        first = r.start_s + (r.ttft_ms or 0) / 1000
        span = end - first
        if r.tokens <= 0:
            continue
        if span <= 0:
            tokens[idx] += r.tokens
            continue
        # Spread over the bins the stream overlapped, by overlap length.
        b = int(first / bin_s)
        while b < nbins and b * bin_s < end:
            lo, hi = max(first, b * bin_s), min(end, (b + 1) * bin_s)
            if hi > lo:
                tokens[b] += r.tokens * (hi - lo) / span
            b += 1
    return [
        {
            "t_s": i * bin_s,
            "tokens_per_s": tokens[i] / bin_s,
            "completions_per_s": done[i] / bin_s,
            "errors_per_s": errs[i] / bin_s,
        }
        for i in range(nbins)
    ]


def ratio(before: float, after: float) -> float:
    """How many times smaller `after` is than `before` (inf when after is 0)."""
    if math.isnan(before) or math.isnan(after):
        return math.nan
    return math.inf if after == 0 else before / after


def highest_sustainable(
    points: Sequence[tuple[float, float, bool]], limit_ms: float
) -> float | None:
    """The highest offered load whose p99 overhead stays within limit_ms and which had no
    errors, from (load, p99_overhead_ms, clean) points; None if no load qualifies.
    A load counts only if every lower load also qualified: one lucky run above a failed
    load is not sustainable."""
    best = None
    for load, overhead, clean in sorted(points):
        if clean and not math.isnan(overhead) and overhead <= limit_ms:
            best = load
        else:
            break
    return best


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- repeated runs --------------------------------------------------------------------------

_AGG_FIELDS = (
    ("ttft_ms", "p50"),
    ("ttft_ms", "p90"),
    ("ttft_ms", "p99"),
    ("total_ms", "p50"),
    ("total_ms", "p99"),
    ("gap_ms", "p50"),
    ("gap_ms", "p99"),
)


def aggregate_runs(runs: Sequence[Mapping[str, Any]], baseline: str = "direct") -> dict[str, Any]:
    """Medians and spreads over repeats, per load point and mode, and the time each mode adds
    to the baseline mode's first token. Each run is {"mode", "load", "repeat", "summary"}; the
    added time is taken repeat by repeat (a mode against the baseline of the same repeat, run
    back to back) and then its median and spread reported."""
    by_load: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for run in runs:
        by_load.setdefault(run["load"], {}).setdefault(run["mode"], []).append(run)
    out: dict[str, Any] = {}
    for load, modes in by_load.items():
        entry: dict[str, Any] = {
            "modes": {},
            "added_ttft_ms": {},
            "added_ttft_first_wave_ms": {},
            "added_ttft_after_first_wave_ms": {},
            # The time each mode adds between two content deliveries (a token frame, an SSE
            # chunk): what relaying the stream costs once it flows.
            "added_gap_ms": {},
        }
        per_request_by_mode: dict[str, list[dict[str, float]]] = {}
        for mode, mode_runs in modes.items():
            summaries = [r["summary"] for r in mode_runs]
            agg: dict[str, Any] = {
                f"{metric}_{q}": median_and_spread([s[metric][q] for s in summaries])
                for metric, q in _AGG_FIELDS
            }
            agg["tokens_per_s"] = median_and_spread([s["tokens_per_s"] for s in summaries])
            agg["qps"] = median_and_spread([s["qps"] for s in summaries])
            agg["in_flight_mean"] = median_and_spread(
                s.get("in_flight_mean", math.nan) for s in summaries
            )
            agg["errors"] = sum(s["errors"] for s in summaries)
            agg["requests"] = sum(s["requests"] for s in summaries)
            agg["cached"] = sum(s["cached"] for s in summaries)
            cpu = [r.get("client_cpu_share", math.nan) for r in mode_runs]
            agg["client_cpu_share"] = median_and_spread(cpu)
            agg["machine_busy"] = median_and_spread(
                r.get("machine_busy", math.nan) for r in mode_runs
            )
            per_request = per_request_by_mode[mode] = [cpu_ms_per_request(r) for r in mode_runs]
            names = sorted({name for p in per_request for name in p})
            agg["cpu_ms_per_request"] = {
                name: median_and_spread(p.get(name, math.nan) for p in per_request)
                for name in names
            }
            entry["modes"][mode] = agg
        base = {r["repeat"]: r["summary"] for r in modes.get(baseline, [])}
        # The stack's CPU per request in units of the simulated engine's in the same run: the
        # engine does the same work per request in every run, so the ratio holds still while a
        # shared host's speed drifts, where the stack's own cost per request moves with it.
        entry["stack_cpu_per_engine_cpu"] = median_and_spread(
            per["stack"] / per[ENGINE_PROCESS]
            for per in per_request_by_mode.get("stack", [])
            if per.get(ENGINE_PROCESS, 0) > 0
        )
        for mode, mode_runs in modes.items():
            if mode == baseline or not base:
                continue
            diffs = [
                added(r["summary"], base[r["repeat"]]) for r in mode_runs if r["repeat"] in base
            ]
            entry["added_ttft_ms"][mode] = {
                f"p{q}": median_and_spread([d[f"p{q}"] for d in diffs]) for q in PERCENTILES
            }
            gap_diffs = [
                added(r["summary"], base[r["repeat"]], "gap_ms")
                for r in mode_runs
                if r["repeat"] in base
            ]
            entry["added_gap_ms"][mode] = {
                f"p{q}": median_and_spread([d[f"p{q}"] for d in gap_diffs]) for q in PERCENTILES
            }
            # A closed loop's first wave (every stream at once) and the rest, apart.
            for part in ("first_wave", "after_first_wave"):
                metric = f"ttft_{part}_ms"
                part_diffs = [
                    added(r["summary"], base[r["repeat"]], metric)
                    for r in mode_runs
                    if r["repeat"] in base
                    and r["summary"].get("first_wave")
                    and metric in base[r["repeat"]]
                ]
                if part_diffs:
                    entry[f"added_{metric}"][mode] = {
                        f"p{q}": median_and_spread([d[f"p{q}"] for d in part_diffs])
                        for q in PERCENTILES
                    }
        out[load] = entry
    return out
