"""Output of a bench run: the summary tables on stdout, JSON, and PNG plots.

matplotlib is imported only when a plot is asked for; it is the optional extra ``bench``
(``pip install 'firsttoken[bench]'``), installed on demand if missing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from firsttoken.bench.stats import (
    ENGINE_PROCESS,
    RequestResult,
    fmt_ms,
    markdown_table,
    ratio,
    timeline,
)


def _ms(spread: Mapping[str, float], with_spread: bool = True) -> str:
    med = fmt_ms(spread["median"])
    if not with_spread or spread.get("n", 0) < 2 or math.isnan(spread["median"]):
        return med
    return f"{med} ({fmt_ms(spread['min'])}..{fmt_ms(spread['max'])})"


def _count(spread: Mapping[str, float] | None) -> str:
    """A median count (e.g. streams in flight), or "-" where the run did not record it."""
    if spread is None or math.isnan(spread["median"]):
        return "-"
    return f"{spread['median']:.0f}"


def _p50_p99(added: Mapping[str, Mapping[str, float]] | None) -> str:
    return f"{_ms(added['p50'])} / {_ms(added['p99'])}" if added else "-"


def summary_table(agg: Mapping[str, Any]) -> str:
    """One row per load point and mode: medians over repeats, (min..max) spread."""
    header = [
        "load",
        "mode",
        "requests",
        "errors",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "total p50",
        "total p99",
        "gap p50",
        "gap p99",
        "tokens/s",
        "streams (mean)",
        "client CPU",
    ]
    rows = []
    for load, entry in agg.items():
        for mode, m in entry["modes"].items():
            cpu = m["client_cpu_share"]["median"]
            rows.append(
                [
                    load,
                    mode,
                    m["requests"],
                    m["errors"],
                    _ms(m["ttft_ms_p50"]),
                    _ms(m["ttft_ms_p90"], False),
                    _ms(m["ttft_ms_p99"]),
                    _ms(m["total_ms_p50"], False),
                    _ms(m["total_ms_p99"], False),
                    _ms(m["gap_ms_p50"], False),
                    _ms(m["gap_ms_p99"], False),
                    f"{m['tokens_per_s']['median']:.0f}",
                    _count(m.get("in_flight_mean")),
                    "-" if math.isnan(cpu) else f"{cpu:.0%}",
                ]
            )
    return markdown_table(header, rows)


def added_table(agg: Mapping[str, Any], baseline: str = "direct") -> str:
    """Time each mode adds to the first token over the baseline (ms; median over repeats,
    (min..max) spread)."""
    header = [
        "load",
        "mode",
        f"added TTFT p50 vs {baseline}",
        "added TTFT p99",
        "added TTFT p90",
        "the first wave: p50 / p99",
        "after the first wave: p50 / p99",
        "added gap p50 / p99",
    ]
    rows = []
    for load, entry in agg.items():
        wave = entry.get("added_ttft_first_wave_ms", {})
        steady = entry.get("added_ttft_after_first_wave_ms", {})
        gaps = entry.get("added_gap_ms", {})
        for mode, a in entry["added_ttft_ms"].items():
            rows.append(
                [
                    load,
                    mode,
                    _ms(a["p50"]),
                    _ms(a["p99"]),
                    _ms(a["p90"]),
                    _p50_p99(wave.get(mode)),
                    _p50_p99(steady.get(mode)),
                    _p50_p99(gaps.get(mode)),
                ]
            )
    return markdown_table(header, rows) if rows else ""


def before_after_table(
    agg: Mapping[str, Any],
    load: str,
    before: str = "naive",
    after: str = "stack",
    floor: str = "direct",
) -> str:
    """The article's table: first-token and full-answer latency, before and after, and ratios."""
    modes = agg.get(load, {}).get("modes", {})
    if before not in modes or after not in modes:
        return ""
    cols = [m for m in (before, after, floor) if m in modes]
    header = ["metric", *cols, f"{before} / {after}"]
    rows = []
    for label, key in (
        ("first token p50 (ms)", "ttft_ms_p50"),
        ("first token p99 (ms)", "ttft_ms_p99"),
        ("full answer p50 (ms)", "total_ms_p50"),
        ("full answer p99 (ms)", "total_ms_p99"),
    ):
        vals = [modes[m][key]["median"] for m in cols]
        r = ratio(modes[before][key]["median"], modes[after][key]["median"])
        rows.append([label, *(fmt_ms(v) for v in vals), "-" if math.isnan(r) else f"{r:.1f}x"])
    return markdown_table(header, rows)


# Column -> the prefix of the process names it sums (as in a run's CPU table; "stack" is the
# stack's processes together, see stats.cpu_ms_per_request).
_CPU_GROUPS = (
    ("client", "client"),
    ("engine (sim)", ENGINE_PROCESS),
    ("gateway", "gateway"),
    ("chat workers", "worker-chat"),
    ("bulk worker", "worker-bulk"),
    ("Redis", "redis"),
    ("stack", "stack"),
)


def cpu_table(agg: Mapping[str, Any]) -> str:
    """CPU ms per answered request by process group (medians over repeats), the stack's CPU in
    units of the simulated engine's in the same run, and how busy the whole machine was."""
    header = [
        "load",
        "mode",
        *(label for label, _ in _CPU_GROUPS),
        "stack / engine",
        "machine busy",
    ]
    rows = []
    for load, entry in agg.items():
        for mode, m in entry["modes"].items():
            per = {name: v["median"] for name, v in m.get("cpu_ms_per_request", {}).items()}
            if not per:
                continue
            cells = []
            for _, prefix in _CPU_GROUPS:
                vals = [
                    v for name, v in per.items() if name.startswith(prefix) and not math.isnan(v)
                ]
                cells.append(f"{sum(vals):.2f}" if vals else "-")
            rel = entry.get("stack_cpu_per_engine_cpu", {}) if mode == "stack" else {}
            busy = m.get("machine_busy", {}).get("median", math.nan)
            rows.append(
                [
                    load,
                    mode,
                    *cells,
                    f"{rel['median']:.1f}x" if rel and not math.isnan(rel["median"]) else "-",
                    "-" if math.isnan(busy) else f"{busy:.0%}",
                ]
            )
    return markdown_table(header, rows) if rows else ""


def print_report(agg: Mapping[str, Any], extra: Sequence[str] = ()) -> None:
    print("\nResults (median over repeats; (min..max) spread across repeats; ms)\n")
    print(summary_table(agg))
    added = added_table(agg)
    if added:
        print("\nAdded time to first token\n")
        print(added)
    for load in agg:
        table = before_after_table(agg, load)
        if table:
            print(f"\nBefore/after at {load}\n")
            print(table)
    cpu = cpu_table(agg)
    if cpu:
        print("\nCPU per answered request (ms; median over repeats)\n")
        print(cpu)
    for line in extra:
        print(line)


def _clean(value: Any) -> Any:
    """JSON without NaN/inf (strict parsers reject them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(payload), indent=2, sort_keys=False) + "\n")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is missing; installing it (the 'bench' extra)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(path: Path, samples: Mapping[str, Sequence[RequestResult]], title: str) -> None:
    """Two panels: the TTFT distribution (CDF, log x) and relayed tokens/s over time, one line
    per series (e.g. "stack c=50"), from one repeat's per-request results."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for label, results in samples.items():
        ttft = sorted(r.ttft_ms for r in results if r.ok and r.ttft_ms is not None)
        if ttft:
            ys = [(i + 1) / len(ttft) for i in range(len(ttft))]
            left.step(ttft, ys, where="post", label=label)
        line = timeline(results, bin_s=0.5)
        if line:
            right.plot([p["t_s"] for p in line], [p["tokens_per_s"] for p in line], label=label)
    left.set_xscale("log")
    left.set_xlabel("time to first token (ms, log scale)")
    left.set_ylabel("share of requests")
    left.set_title("TTFT distribution (CDF)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    right.set_xlabel("time since start of run (s)")
    right.set_ylabel("tokens/s delivered to clients")
    right.set_title("throughput over time")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_from_json(path: Path) -> str:
    """The tables of a saved run (``--json``), as Markdown: what docs/benchmarks.md quotes."""
    data = json.loads(path.read_text())
    agg = data["aggregate"]
    parts = [f"`{data['command']}`", "", summary_table(_nan(agg))]
    added = added_table(_nan(agg))
    if added:
        parts += ["", added]
    for load in agg:
        table = before_after_table(_nan(agg), load)
        if table:
            parts += ["", table]
    cpu_ms = cpu_table(_nan(agg))
    if cpu_ms:
        parts += ["", "CPU per answered request (ms; median over repeats):", "", cpu_ms]
    cpu: dict[str, dict[str, list[float]]] = {}
    for run in data["runs"]:
        for proc, share in run.get("server_cpu_share", {}).items():
            if share is not None and share > 0.005:
                cpu.setdefault(f"{run['mode']} {run['load']}", {}).setdefault(proc, []).append(
                    share
                )
    if cpu:
        parts += ["", "CPU per process (share of one core, median over repeats):", ""]
        for label, procs in cpu.items():
            shares = ", ".join(f"{p} {sorted(v)[len(v) // 2]:.0%}" for p, v in procs.items())
            parts.append(f"- {label}: {shares}")
    loads = [r.get("loadavg_1m_before") for r in data["runs"]]
    loads = [x for x in loads if x is not None]
    busy = [r.get("machine_busy_before") for r in data["runs"]]
    busy = [x for x in busy if x is not None]
    if busy:
        parts += ["", f"machine CPU busy just before the runs: {min(busy):.0%}..{max(busy):.0%}"]
    if loads:
        parts += ["", f"1-minute load average before the runs: {min(loads):.1f}..{max(loads):.1f}"]
    if data.get("sustainable"):
        s = data["sustainable"]
        parts += [
            "",
            f"highest rate with p99 added TTFT <= {s['limit_ms']:g} ms and no errors: "
            f"{s['highest_rate']} req/s",
        ]
    return "\n".join(parts)


def _nan(value: Any) -> Any:
    """JSON nulls back to NaN, for the table helpers."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: _nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan(v) for v in value]
    return value


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(markdown_from_json(Path(arg)))
        print()
