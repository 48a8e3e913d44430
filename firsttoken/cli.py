"""The `firsttoken` command. It sits above `gateway/` and `workers/` and starts them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from shared.errors import ConfigError
from shared.keys import BULK_QUEUE, CHAT_QUEUE, QUEUES

CHAT_SWITCH_INTERVAL_S = 0.0005


def _cmd_up(args: argparse.Namespace) -> int:
    from firsttoken.up import run_up

    return run_up(port=args.port, host=args.host)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from gateway.__main__ import main

    argv = ["--host", args.host] if args.host else []
    argv += ["--port", str(args.port)] if args.port is not None else []
    argv += ["--reuse-port"] if args.reuse_port else []
    return main(argv)


def _cmd_worker(args: argparse.Namespace) -> int:
    from shared.settings import get_settings

    settings = get_settings()
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        print(
            f"error: unknown queue(s) {', '.join(unknown)}; known: {', '.join(QUEUES)}",
            file=sys.stderr,
        )
        return 2
    # Chat tasks only hand the job to the process's asyncio loop (see workers/chat.py), so
    # the solo pool serves them with one thread hop; bulk tasks block on the database and
    # need real threads. A worker for both queues uses threads.
    solo = queues == [CHAT_QUEUE]
    concurrency = 1 if solo else args.concurrency or settings.bulk_concurrency
    if solo and args.concurrency:
        os.environ["FIRSTTOKEN_CHAT_CONCURRENCY"] = str(args.concurrency)
        get_settings.cache_clear()
    if CHAT_QUEUE not in queues and settings.background_nice and hasattr(os, "nice"):
        # Low-priority work at low CPU priority: on a shared host the bulk and summarize pools
        # run in the time the chat path leaves idle (their queues absorb the wait).
        os.nice(settings.background_nice)
        _lower_session_priority(settings.background_nice)
    if solo and args.pool == "asyncio":
        sys.setswitchinterval(CHAT_SWITCH_INTERVAL_S)  # the loop shares the GIL with embeddings
        return _serve_chat(args, get_settings().chat_concurrency)
    from workers.app import app

    if solo:
        # Two threads share the GIL here: kombu's consumer and the chat loop. A thread that
        # wakes for a new chat waits for the other to release the GIL, up to the switch
        # interval (5 ms by default), in front of every first token.
        sys.setswitchinterval(CHAT_SWITCH_INTERVAL_S)
        # Chat tasks are acked on receipt and never redelivered (a late answer is a wrong
        # answer), so kombu's unacked bookkeeping would only add Redis round trips in front of
        # every chat. Bulk workers keep it: their acks_late is what makes writes durable.
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "ack_emulation": False,
        }

    name = args.name or f"{'-'.join(queues)}@%h"
    app.worker_main(
        argv=[
            "--quiet",
            "worker",
            "-Q",
            ",".join(queues),
            "-P",
            "solo" if solo else "threads",
            "-c",
            str(concurrency),
            "-n",
            name,
            "-l",
            args.loglevel,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )
    return 0


def _serve_chat(args: argparse.Namespace, concurrency: int) -> int:
    """The chat queue on the asyncio pool (workers/consumer.py): no Celery thread hops."""
    import logging

    import uvloop
    from celery.utils.nodenames import host_format

    from shared.keys import CHAT_QUEUE
    from workers.app import SHUTDOWN_GRACE_S
    from workers.chat import HANDLERS, warm_chat_worker
    from workers.consumer import serve
    from workers.deferred import deferred

    logging.basicConfig(
        level=args.loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    uvloop.run(
        serve(
            name=host_format(args.name or f"{CHAT_QUEUE}@%h"),
            queue=CHAT_QUEUE,
            handlers=HANDLERS,
            concurrency=concurrency,
            shutdown_grace_s=SHUTDOWN_GRACE_S,
            warm=warm_chat_worker,
            after_read=deferred.after_read,
        )
    )
    return 0


def _lower_session_priority(nice: int) -> None:
    """Where the kernel groups scheduling by session (Linux autogroup, on by default on most
    distributions), nice ranks processes only within their session; between sessions the
    session's own nice counts. A worker that leads its session (under `firsttoken up`, the
    benchmark, systemd or a container's init) lowers that one too. Best effort."""
    if os.getsid(0) != os.getpid():
        return  # sharing a session: lowering it would also slow the others in it
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroup here: plain nice is what counts


def _cmd_migrate(args: argparse.Namespace) -> int:
    from shared.db.migrate import upgrade
    from shared.settings import get_settings

    url = get_settings().database_url
    upgrade(url)
    print(f"database at {url} is up to date")
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    from firsttoken.client import run_chat

    return run_chat(
        args.question,
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        max_tokens=args.max_tokens,
        no_cache=args.no_cache,
    )


def _cmd_sim_server(args: argparse.Namespace) -> int:
    from firsttoken.simserver import main

    return main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="firsttoken",
        description="Low-latency serving stack for AI chat. `firsttoken up` runs it all locally.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(fn=fn)
        return p

    p = add(
        "up",
        _cmd_up,
        "Run the whole stack locally: embedded Redis (unless "
        "FIRSTTOKEN_REDIS_URL), SQLite (unless FIRSTTOKEN_DATABASE_URL), the simulated engine "
        "(unless FIRSTTOKEN_ENGINE_URL), migrations, a gateway, a chat and a bulk worker.",
    )
    p.add_argument(
        "--port", type=int, default=None, help="gateway port (default FIRSTTOKEN_PORT, 8000)"
    )
    p.add_argument("--host", default=None, help="gateway bind address (default FIRSTTOKEN_HOST)")

    p = add("gateway", _cmd_gateway, "Run one gateway process (websocket + health + metrics).")
    p.add_argument("--port", type=int, default=None, help="port (default FIRSTTOKEN_PORT)")
    p.add_argument("--host", default=None, help="bind address (default FIRSTTOKEN_HOST)")
    p.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the port with other gateway processes on this host (SO_REUSEPORT)",
    )

    p = add("worker", _cmd_worker, "Run one Celery worker process for the given queues.")
    p.add_argument(
        "--queues",
        default=CHAT_QUEUE,
        help=f"comma-separated queues: {CHAT_QUEUE} (interactive), {BULK_QUEUE} (writes)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="chats in flight (chat queue; default FIRSTTOKEN_CHAT_CONCURRENCY) or threads "
        "(bulk; default FIRSTTOKEN_BULK_CONCURRENCY)",
    )
    p.add_argument(
        "--pool",
        choices=("asyncio", "celery"),
        default="asyncio",
        help="how a chat-only worker runs: asyncio (default; the chat queue read straight into "
        "the process's event loop, see workers/consumer.py) or celery (a Celery worker whose "
        "solo pool hands each chat to that loop). Workers of other queues always run Celery.",
    )
    p.add_argument("--name", default=None, help="worker node name (default QUEUES@hostname)")
    p.add_argument("--loglevel", default="warning", help="Celery log level (default warning)")

    add("migrate", _cmd_migrate, "Apply database migrations (FIRSTTOKEN_DATABASE_URL).")

    from firsttoken.keyscli import register as register_keys

    register_keys(sub)

    p = add(
        "chat",
        _cmd_chat,
        "Ask a running stack one question; streams the answer and prints the timings.",
    )
    p.add_argument("question", help="the question")
    p.add_argument(
        "--url",
        default=None,
        help="gateway websocket URL (default: the one "
        "`firsttoken up` wrote to .firsttoken/dev.json, else ws://127.0.0.1:8000/v1/ws)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="API key (default FIRSTTOKEN_API_KEY, "
        "FIRSTTOKEN_DEV_API_KEY, or the one `firsttoken up` wrote)",
    )
    p.add_argument("--model", default=None, help="model name")
    p.add_argument("--max-tokens", type=int, default=None, help="longest answer, in tokens")
    p.add_argument("--no-cache", action="store_true", help="bypass the answer cache")

    p = add(
        "sim-server",
        _cmd_sim_server,
        "Run the simulated OpenAI-compatible engine (see `firsttoken sim-server --help`).",
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options for the simulator")

    from firsttoken.cachecli import add_parser as add_cache_parser

    add_cache_parser(sub)

    from firsttoken.kbcli import add_parser as add_kb_parser

    add_kb_parser(sub)

    from firsttoken.bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim-server"]:
        # The simulator parses its own options (argparse.REMAINDER would miss leading flags).
        rest = argv[1:]
        args = argparse.Namespace(fn=_cmd_sim_server, rest=rest[1:] if rest[:1] == ["--"] else rest)
    else:
        args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"firsttoken: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
