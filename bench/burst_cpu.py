"""CPU per chat of each stack process when chats arrive in bursts (a closed loop's first wave).

    python bench/burst_cpu.py --streams 50 --bursts 20 --repeats 3

Starts the bench's stack (the simulator, `--workers` chat workers, a bulk worker, one gateway)
on the machine's Redis and PostgreSQL (else the embedded defaults), opens `--streams` websocket
connections and warms each with one chat, then sends `--bursts` bursts of one chat per
connection at once (one-token answers, cache off), waiting for every answer before the next.
Prints the CPU each process spent per chat. With one-token answers nearly all of it is
per-chat work (frame, admission, queue, prompt, engine request, `accepted`, `started`, `done`):
the work a burst waits on, one chat at a time in each process. Less noisy than latency.

    python bench/burst_cpu.py --streams 50 --bursts 20 --window-ms 100

With `--window-ms`, counts instead only the CPU spent in the first that many ms of each burst
(every thread of every process, this client included, from /proc's nanosecond `schedstat`):
with the simulator's 150 ms to the first token and a window that ends before it, that is the
work the burst needs before its engine requests are all out, the part that decides how late
the last chat of a closed loop's first wave gets its first token. The total over the number of
cores is the least time that work can take on this machine.

    python bench/burst_cpu.py --streams 200 --bursts 10 --repeats 1 --syscalls

With `--syscalls`, also prints each process's read and write system calls per chat (Linux
/proc's `syscr` / `syscw`), over whole chats: a count that does not drift with the host's
speed. A write that wakes an idle process costs CPU on both sides; a burst's writes shared by
many chats cost a fraction of that each. (They count
read()/write()-family calls: the socket I/O of uvloop, which the stack's processes run on,
and of Redis. This client is left out: it reads /proc meanwhile.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from firsttoken.bench.loadgen import StackClient
from firsttoken.bench.profiles import get_profile
from firsttoken.bench.stack import BenchStack, cpu_seconds


def io_calls(pid: int) -> tuple[int, int]:
    """(read, write) system calls of one process so far (Linux /proc; (0, 0) elsewhere)."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines()
        )
        return int(fields["syscr"]), int(fields["syscw"])
    except (OSError, KeyError, ValueError):
        return 0, 0


async def _measure(
    stack: BenchStack,
    streams: int,
    bursts: int,
    window_s: float,
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Per process: its CPU per chat (ms), and its (reads, writes) system calls per chat."""
    client = StackClient(
        stack.ws_url, stack.api_key, connections=streams, max_tokens=1, cache=False
    )
    await client.open()
    try:
        # One chat per connection at a time: the client spreads a burst over its connections.
        await asyncio.gather(*(client.send(f"warm {i}") for i in range(streams)))
        served = stack.pids()  # system calls: these only (this client reads /proc meanwhile)
        pids = {**served, "client": os.getpid()} if window_s else served
        spent = dict.fromkeys(pids, 0.0)  # s of CPU: whole chats, or the windows only
        whole = {name: cpu_seconds(pid) for name, pid in pids.items()}
        io_before = {name: io_calls(pid) for name, pid in served.items()}
        answered = 0
        for b in range(bursts):
            burst = asyncio.gather(
                *(client.send(f"burst question {b}-{i}") for i in range(streams))
            )
            if window_s:
                start = {name: cpu_seconds(pid) for name, pid in pids.items()}
                await asyncio.sleep(window_s)
                for name, pid in pids.items():
                    spent[name] += cpu_seconds(pid) - start[name]
            results = await burst
            answered += sum(r.error is None for r in results)
            await asyncio.sleep(0.2)  # let the tail (usage rows, unsubscribes) settle
        if answered < streams * bursts:
            raise RuntimeError(f"only {answered} of {streams * bursts} chats were answered")
        if not window_s:
            spent = {name: cpu_seconds(pid) - whole[name] for name, pid in pids.items()}
        calls = {}
        for name, pid in served.items():
            reads, writes = io_calls(pid)
            before_reads, before_writes = io_before[name]
            calls[name] = ((reads - before_reads) / answered, (writes - before_writes) / answered)
        return {name: s * 1e3 / answered for name, s in spent.items()}, calls
    finally:
        await client.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=50, help="connections, one chat each per burst")
    p.add_argument("--bursts", type=int, default=20, help="bursts per repeat (default: 20)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="chat worker processes (default: 2)")
    p.add_argument(
        "--window-ms",
        type=float,
        default=0.0,
        help="count only the CPU of the first WINDOW ms of each burst, this client included "
        "(below the simulator's 150 ms to the first token; default: whole chats)",
    )
    p.add_argument(
        "--syscalls",
        action="store_true",
        help="also print each process's read and write system calls per chat (whole chats)",
    )
    args = p.parse_args()
    if not 0 <= args.window_ms < 150:
        p.error("--window-ms must be at least 0 and below the simulator's 150 ms first token")
    stack = BenchStack(get_profile("chat-8b"), workers=args.workers)
    try:
        stack.start_stack()
        measured = [
            asyncio.run(_measure(stack, args.streams, args.bursts, args.window_ms / 1000))
            for _ in range(args.repeats)
        ]
    finally:
        stack.close()
    runs = [cpu for cpu, _ in measured]
    calls = [per_chat for _, per_chat in measured]  # per repeat: (reads, writes) per chat
    part = f"in the first {args.window_ms:g} ms of " if args.window_ms else "in "
    print(f"CPU per chat {part}bursts of {args.streams} (ms; median over {args.repeats} repeats)")
    for name in runs[0]:
        values = [r[name] for r in runs]
        spread = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:14s} {statistics.median(values):.3f}  ({spread})")
    if args.window_ms:
        total = statistics.median(sum(r.values()) for r in runs)
        cores = os.cpu_count() or 1
        print(
            f"  {'all':14s} {total:.3f}: {total * args.streams:.1f} ms of CPU per burst, at "
            f"least {total * args.streams / cores:.1f} ms on {cores} cores"
        )
    if args.syscalls:
        print(f"system calls per chat, whole chats (median over {args.repeats} repeats)")
        for name in calls[0]:
            reads = statistics.median(c[name][0] for c in calls)
            writes = statistics.median(c[name][1] for c in calls)
            print(f"  {name:14s} reads {reads:5.2f}  writes {writes:5.2f}")
        reads = statistics.median(sum(v[0] for v in c.values()) for c in calls)
        writes = statistics.median(sum(v[1] for v in c.values()) for c in calls)
        print(f"  {'all':14s} reads {reads:5.2f}  writes {writes:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
