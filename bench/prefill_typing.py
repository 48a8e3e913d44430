"""Prefill while the user types (issue 34): time to first token at send, with drafts and without.

    python bench/prefill_typing.py --engine sim --chats 50
    python bench/prefill_typing.py --engine-url http://127.0.0.1:8100/v1 --engine-model tiny \\
        --chats 50          # a running vLLM server (prefix caching on)

Starts a stack (gateway, one chat worker, one bulk worker; firsttoken/bench/stack.py) in front of
the engine: with ``--engine sim`` a sim-server with a per-token prefill cost and a prefix cache
(``--prefill-ms-per-token``, default 0.1: about an 8B model's prefill on one GPU), else the
OpenAI-compatible server at ``--engine-url``. Every chat is a fresh conversation of about
``--words`` tokens (random words of the tiny test model's vocabulary, one token each there):
a user turn, an assistant turn, and the new message, typed at ``--draft-rate`` drafts a second
(each draft the text so far); the chat is sent ``--send-after-ms`` after the last draft, with a
few words more. Chats with drafts and without alternate in the same run, one at a time, so
both see the same machine. The TTFT is the client's: send to the first token frame.

``--cpu`` also measures what drafts cost the stack's processes (gateway, chat worker, Redis,
bulk worker): CPU seconds over a run of chats alone, then over drafts alone at ``--draft-rate``
(``--cpu-users`` typing users, one conversation each), each per request, less the stack's
idle CPU over the same time (``--idle-s``, measured between the two). ``--chats 0 --cpu``:
only that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import websockets

from firsttoken.bench.stack import (
    BenchStack,
    cpu_seconds,
    free_port,
    http_get,
    port_open,
    wait_for,
)
from firsttoken.bench.stats import percentile

VOCABULARY = [f"w{i}" for i in range(500)]  # tests/vllm/tinymodel.py's words


def conversation(rng: random.Random, words: int) -> tuple[list[dict[str, str]], list[str]]:
    """A fresh conversation of about `words` words: history, and the new message's words."""
    new = max(8, words // 20)
    user, answer = (words - new) // 2, words - new - (words - new) // 2
    pick = lambda n: " ".join(rng.choice(VOCABULARY) for _ in range(n))  # noqa: E731
    history = [
        {"role": "user", "content": pick(user)},
        {"role": "assistant", "content": pick(answer)},
    ]
    return history, [rng.choice(VOCABULARY) for _ in range(new)]


async def _first_token(ws: Any, chat_id: str) -> tuple[float, dict[str, Any]]:
    """Wait for the chat's first token (its time) and then its `done`."""
    first = 0.0
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if frame.get("id") != chat_id:
            continue
        if frame["type"] == "token" and not first:
            first = time.perf_counter()
        elif frame["type"] in ("done", "error"):
            return first, frame


async def one_chat(
    ws: Any, rng: random.Random, index: int, args: argparse.Namespace, drafts: bool
) -> dict[str, Any]:
    history, new = conversation(rng, args.words)
    period = 1.0 / args.draft_rate
    # The user types the message over `typing` drafts; the last words come after the last one.
    typed_at_send = len(new)
    steps = max(1, int(args.typing_s * args.draft_rate))
    for k in range(1, steps + 1):
        if drafts:
            upto = max(1, (typed_at_send - 2) * k // steps)
            draft = {
                "type": "draft",
                "id": f"d{index}-{k}",
                "messages": history,
                "text": " ".join(new[:upto]),
            }
            await ws.send(json.dumps(draft))
        await asyncio.sleep(period)
    await asyncio.sleep(max(0.0, args.send_after_ms / 1000 - period))
    chat_id = f"c{index}"
    messages = [*history, {"role": "user", "content": " ".join(new)}]
    chat = {"type": "chat", "id": chat_id, "messages": messages, "max_tokens": 4, "cache": False}
    sent = time.perf_counter()
    await ws.send(json.dumps(chat))
    first, last = await _first_token(ws, chat_id)
    if last["type"] != "done":
        raise RuntimeError(f"chat {chat_id} failed: {last}")
    usage = last["usage"]
    return {
        "drafts": drafts,
        "ttft_ms": (first - sent) * 1000,
        "prompt_tokens": usage.get("engine_prompt_tokens", usage["prompt_tokens"]),
        "cached_prompt_tokens": usage.get("cached_prompt_tokens"),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    ttft = [r["ttft_ms"] for r in rows]
    cached = [r["cached_prompt_tokens"] or 0 for r in rows]
    return {
        "chats": len(rows),
        "ttft_p50_ms": statistics.median(ttft),
        "ttft_p90_ms": percentile(ttft, 90),
        "ttft_p99_ms": percentile(ttft, 99),
        "prompt_tokens_p50": statistics.median(r["prompt_tokens"] for r in rows),
        "cached_prompt_tokens_p50": statistics.median(cached),
    }


async def _cpu_per(stack: BenchStack, work: Any) -> tuple[float, float]:
    """CPU seconds of the stack's processes (the engine's left out) while `work` runs, and
    the wall seconds it took."""
    pids = {n: p for n, p in stack.pids().items() if n != "sim"}
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    started = time.perf_counter()
    await work
    await asyncio.sleep(1.0)  # usage rows and prefills finish
    wall = time.perf_counter() - started
    after = {n: cpu_seconds(p) for n, p in pids.items()}
    return sum(after[n] - before[n] for n in before), wall


def _engine_requests(stack: BenchStack) -> float:
    """Requests the engine started so far (the sim-server's counter; NaN for another engine)."""
    if stack.sim_port <= 0:
        return float("nan")
    _, text = http_get(f"http://127.0.0.1:{stack.sim_port}/metrics")
    for line in text.splitlines():
        if line.startswith("firsttoken_sim_requests_started_total "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


async def cpu_costs(stack: BenchStack, args: argparse.Namespace) -> dict[str, float]:
    """CPU per chat and per draft, `--cpu-users` users at once (so the stack's idle CPU is a
    small part of each phase), each phase `--cpu-requests` requests in all."""
    rng = random.Random(7)
    users, each = args.cpu_users, max(1, args.cpu_requests // args.cpu_users)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    sockets = [
        await websockets.connect(stack.ws_url, additional_headers=headers, max_size=None)
        for _ in range(users)
    ]

    async def chats(u: int) -> None:
        for i in range(each):
            history, new = conversation(rng, args.words)
            msg = [*history, {"role": "user", "content": " ".join(new)}]
            # The cache off: the cheaper chat (no embedding), so the share is an upper bound.
            chat = {"type": "chat", "id": f"cpu{u}-{i}", "messages": msg, "cache": False}
            await sockets[u].send(json.dumps({**chat, "max_tokens": 4}))
            await _first_token(sockets[u], f"cpu{u}-{i}")

    async def drafts(u: int) -> None:
        history, new = conversation(rng, args.words)  # one conversation per typing user
        for i in range(each):
            text = " ".join(new[: 1 + i % len(new)])  # a word more at each draft, as typed
            draft = {"type": "draft", "id": f"cd{u}-{i}", "messages": history, "text": text}
            await sockets[u].send(json.dumps(draft))
            await asyncio.sleep(1.0 / args.draft_rate)

    async def all_of(work: Any) -> None:
        await asyncio.gather(*(work(u) for u in range(users)))

    try:
        chat_cpu, chat_wall = await _cpu_per(stack, all_of(chats))
        # The stack's own background work (heartbeats, sweeps, pollers) runs in every phase:
        # measured alone, once warm, and taken off each phase for its length.
        idle_cpu, idle_wall = await _cpu_per(stack, asyncio.sleep(args.idle_s))
        started = _engine_requests(stack)
        draft_cpu, draft_wall = await _cpu_per(stack, all_of(drafts))
        prefills = _engine_requests(stack) - started
    finally:
        for ws in sockets:
            await ws.close()
    idle_rate = idle_cpu / idle_wall
    count = users * each
    chat_ms = (chat_cpu - idle_rate * chat_wall) * 1000 / count
    draft_ms = (draft_cpu - idle_rate * draft_wall) * 1000 / count
    return {
        "idle_cpu_ms_per_s": idle_rate * 1000,
        "chat_cpu_ms": chat_ms,
        "draft_cpu_ms": draft_ms,
        "draft_share": draft_ms / chat_ms,
        # Drafts that reached the engine (the rest were superseded while queued, or dropped).
        "drafts_prefilled": prefills,
        "chat_phase_s": chat_wall,
        "draft_phase_s": draft_wall,
    }


async def run(stack: BenchStack, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    async with websockets.connect(stack.ws_url, additional_headers=headers, max_size=None) as ws:
        for i in range(args.warmup if args.chats else 0):
            await one_chat(ws, rng, -1 - i, args, drafts=bool(i % 2))
        for i in range(2 * args.chats):
            rows.append(await one_chat(ws, rng, i, args, drafts=bool(i % 2)))
            if not args.quiet:
                r = rows[-1]
                print(
                    f"{i:4d} drafts={r['drafts']!s:5} ttft {r['ttft_ms']:8.1f} ms"
                    f"  cached {r['cached_prompt_tokens']}/{r['prompt_tokens']}",
                    file=sys.stderr,
                )
        result: dict[str, Any] = {}
        if rows:
            result["with_drafts"] = summary([r for r in rows if r["drafts"]])
            result["without_drafts"] = summary([r for r in rows if not r["drafts"]])
            result["ttft_ratio_p50"] = (
                result["with_drafts"]["ttft_p50_ms"] / result["without_drafts"]["ttft_p50_ms"]
            )
        if args.cpu:
            result["cpu"] = await cpu_costs(stack, args)
    return result


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python bench/prefill_typing.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--engine",
        choices=["sim", "url"],
        default="sim",
        help="sim: start a sim-server; url: the server at --engine-url (default: %(default)s)",
    )
    p.add_argument("--engine-url", help="an OpenAI-compatible server's /v1 URL (vLLM)")
    p.add_argument("--engine-model", default="sim", help="its model name (default: %(default)s)")
    p.add_argument("--chats", type=int, default=50, help="chats per mode (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="chats not counted (default: 2)")
    p.add_argument("--words", type=int, default=2000, help="conversation size (default: 2000)")
    p.add_argument("--draft-rate", type=float, default=5.0, help="drafts/s while typing (5)")
    p.add_argument("--typing-s", type=float, default=2.0, help="typing time (default: 2.0)")
    p.add_argument("--send-after-ms", type=float, default=200.0, help="last draft to send (200)")
    p.add_argument("--prefill-ms-per-token", type=float, default=0.1, help="sim prefill cost")
    p.add_argument("--ttft-ms", type=float, default=30.0, help="sim base TTFT (default: 30)")
    p.add_argument("--cpu", action="store_true", help="also measure CPU per chat and per draft")
    p.add_argument("--cpu-requests", type=int, default=100, help="requests per CPU phase (100)")
    p.add_argument("--idle-s", type=float, default=10.0, help="idle phase of --cpu (10 s)")
    p.add_argument("--cpu-users", type=int, default=20, help="users at once in --cpu (20)")
    p.add_argument("--seed", type=int, default=1, help="conversation words' seed (default: 1)")
    p.add_argument("--json", type=Path, help="write the figures here too")
    p.add_argument("--quiet", action="store_true", help="no line per chat")
    args = p.parse_args()
    if args.engine == "url" and not args.engine_url:
        p.error("--engine url needs --engine-url")
    settings = {
        # A 2,000-word conversation in full: the builder's tokenizer counts these words as
        # several tokens each.
        "prompt_budget_tokens": "16000",
        "engine_model": args.engine_model,
        "first_token_deadline_s": "30",
        "engine_idle_timeout_s": "30",
        "stream_idle_timeout_s": "60",
        "queue_deadline_s": "30",
        "max_frame_bytes": str(4 << 20),
        # The bench's users share one API key: its draft budget must not be what is measured.
        "draft_rate_per_s": "100000",
    }
    stack = BenchStack(None, workers=1, settings=settings)
    try:
        if args.engine == "sim":
            stack.sim_port = free_port()
            stack._start(
                "sim",
                [
                    "-m", "firsttoken.simserver", "--port", str(stack.sim_port),
                    "--ttft-ms", str(args.ttft_ms), "--itl-ms", "10", "--max-tokens", "16",
                    "--prefill-ms-per-token", str(args.prefill_ms_per_token),
                    "--prefix-cache-tokens", "4000000",
                ],
            )  # fmt: skip
            wait_for(lambda: port_open(stack.sim_port), 30, "sim-server", stack.procs)
        else:
            stack.settings["engine_url"] = args.engine_url
            stack.sim_port = -1  # no sim-server: start_stack must not start one
        stack.start_stack()
        result = asyncio.run(run(stack, args))
    finally:
        stack.close()
    result["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
