"""CPU a chat worker spends per token and per chat, without Celery, the gateway or a client.

Runs the real `ChatRun` (admission, retrieval, engine stream, coalescing, publishing, usage
record) in this process against a sim-server child on the machine's Redis, with `--streams`
chats in flight for `--seconds`, and prints process CPU (all threads) per chat and per token.
The number to watch when changing the worker's hot path; the full stack is `firsttoken bench`.

    python scripts/bench_worker_cpu.py --streams 25 --seconds 15 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from firsttoken.bench.stack import free_port, port_open, wait_for  # noqa: E402
from firsttoken.procs import Child  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=25, help="chats in flight (default: 25)")
    p.add_argument("--seconds", type=float, default=15.0, help="per run (default: 15)")
    p.add_argument("--runs", type=int, default=3, help="repeats (default: 3)")
    p.add_argument("--tokens", type=int, default=24, help="tokens per answer (default: 24)")
    p.add_argument("--itl-ms", type=float, default=15.0, help="sim gap between tokens")
    p.add_argument("--ttft-ms", type=float, default=150.0, help="sim time to first token")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ft-wcpu-"))
    port = free_port()
    prefix = f"ftwcpu{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    sim = Child(
        [sys.executable, "-m", "shared.simserver", "--port", str(port), "--ttft-ms",
         str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--max-tokens", str(args.tokens),
         "--jitter", "0"],
        env, work / "sim.log",
    )  # fmt: skip
    try:
        wait_for(lambda: port_open(port), 30, "sim-server", {"sim": sim})
        os.environ.update(
            {
                "FIRSTTOKEN_REDIS_URL": args.redis_url,
                "FIRSTTOKEN_REDIS_PREFIX": prefix,
                "FIRSTTOKEN_DATABASE_URL": f"sqlite+aiosqlite:///{work / 'db.sqlite'}",
                "FIRSTTOKEN_ENGINE": "openai",
                "FIRSTTOKEN_ENGINE_URL": f"http://127.0.0.1:{port}/v1",
                "FIRSTTOKEN_LOG_LEVEL": "WARNING",
            }
        )
        from shared.db.migrate import upgrade

        upgrade(os.environ["FIRSTTOKEN_DATABASE_URL"])
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as in the worker
            results = runner.run(_runs(args))
    finally:
        sim.stop()
    per_chat = [r[0] for r in results]
    per_token = [r[1] for r in results]
    print(
        f"median over {len(results)} runs: {statistics.median(per_chat):.2f} ms CPU per chat, "
        f"{statistics.median(per_token):.1f} us CPU per token"
    )
    return 0


async def _runs(args: argparse.Namespace) -> list[tuple[float, float, int]]:
    from shared.protocol import Message
    from shared.tasks import ChatJob
    from workers.chat import ChatRun
    from workers.context import close_context, get_context

    ctx = await get_context()
    out: list[tuple[float, float, int]] = []
    try:
        for run in range(args.runs + 1):  # run 0 warms up (tokenizers, pools, connections)
            chats = tokens = 0
            stop_at = time.monotonic() + (3.0 if run == 0 else args.seconds)

            async def one_stream(i: int, stop_at: float = stop_at) -> None:
                nonlocal chats, tokens
                while time.monotonic() < stop_at:
                    now = time.time()
                    job = ChatJob(
                        job_id=uuid.uuid4().hex,
                        chat_id=f"c{i}",
                        tenant_id="bench",
                        key_id="bench",
                        messages=[Message(role="user", content=f"question {i} {chats}")],
                        max_tokens=args.tokens,
                        cache=False,
                        received_at=now,
                        enqueued_at=now,
                        deadline_at=now + 30,
                    )
                    chat = ChatRun(ctx, job)
                    await chat.run()
                    chats += 1
                    tokens += chat.completion_tokens

            cpu0, t0 = time.process_time(), time.monotonic()
            await asyncio.gather(*(one_stream(i) for i in range(args.streams)))
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - t0
            if run == 0:
                continue
            row = (cpu * 1000 / max(chats, 1), cpu * 1e6 / max(tokens, 1), chats)
            out.append(row)
            print(
                f"run {run}: {chats} chats, {tokens} tokens in {wall:.1f}s, CPU {cpu / wall:.0%} "
                f"of a core: {row[0]:.2f} ms per chat, {row[1]:.1f} us per token",
                flush=True,
            )
    finally:
        keys = [k async for k in ctx.redis.scan_iter(match=f"{ctx.keys.prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await ctx.redis.delete(*keys[i : i + 500])
        await close_context()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
