"""The `firsttoken` command. It sits above `gateway/` and `workers/` and starts them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from shared.errors import ConfigError
from shared.keys import BULK_QUEUE, CHAT_QUEUE, QUEUES


def _cmd_up(args: argparse.Namespace) -> int:
    from firsttoken.up import run_up

    return run_up(port=args.port, host=args.host)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from gateway.__main__ import main

    argv = ["--host", args.host] if args.host else []
    argv += ["--port", str(args.port)] if args.port is not None else []
    argv += ["--reuse-port"] if args.reuse_port else []
    return main(argv)


def worker_argv(
    queues: list[str],
    *,
    concurrency: int,
    name: str | None,
    loglevel: str,
    events: bool,
) -> list[str]:
    """`celery worker` arguments for a pool on `queues`.

    A chat-only worker runs Celery's solo pool: kombu hands it no chats (workers/chat/pool.py
    reads the chat queue on the process loop), so a pool thread would only sit idle. Bulk and
    summarize tasks block on the database and need real threads; a worker for chat and other
    queues uses threads too. Worker heartbeats (what Flower counts a worker online by) are
    sent only with `events`."""
    solo = queues == [CHAT_QUEUE]
    argv = [
        "--quiet",
        "worker",
        "-Q",
        ",".join(queues),
        "-P",
        "solo" if solo else "threads",
        "-c",
        str(1 if solo else concurrency),
        "-n",
        name or f"{'-'.join(queues)}@%h",
        "-l",
        loglevel,
        "--without-gossip",
        "--without-mingle",
    ]
    return [*argv, "-E"] if events else [*argv, "--without-heartbeat"]


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
    if args.concurrency is not None and args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    chat = CHAT_QUEUE in queues
    if chat and args.concurrency:
        os.environ["FIRSTTOKEN_CHAT_CONCURRENCY"] = str(args.concurrency)
        get_settings.cache_clear()
    if not chat and settings.background_nice and hasattr(os, "nice"):
        # Low-priority work at low CPU priority: on a shared host the bulk and summarize pools
        # run in the time the chat path leaves idle (their queues absorb the wait).
        os.nice(settings.background_nice)
        _lower_session_priority(settings.background_nice)
    from workers.app import app

    if queues == [CHAT_QUEUE]:
        # Chat tasks are acked on receipt and never redelivered (a late answer is a wrong
        # answer), and kombu reads no queue here: its unacked bookkeeping would only add
        # Redis round trips. Bulk workers keep it: their acks_late makes writes durable.
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "ack_emulation": False,
        }
    app.worker_main(
        argv=worker_argv(
            queues,
            concurrency=args.concurrency or settings.bulk_concurrency,
            name=args.name,
            loglevel=args.loglevel,
            events=args.events,
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
    from firsttoken.migrate import upgrade
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
        openai=args.openai,
    )


def _cmd_sim_server(args: argparse.Namespace) -> int:
    from firsttoken.simserver import main

    return main(args.rest)


# The subcommands in modules of their own, each added by the module's function. Building the
# parser for one command imports only that command's module: the others' imports (the settings,
# SQLAlchemy, Redis, prometheus_client) would add to every command's start-up.
COMMAND_MODULES = {
    "keys": ("firsttoken.keyscli", "register"),
    "cache": ("firsttoken.cachecli", "add_parser"),
    "usage": ("firsttoken.usagecli", "add_parser"),
    "workers": ("firsttoken.workerscli", "add_parser"),
    "metrics-server": ("firsttoken.metricscli", "add_parser"),
    "kb": ("firsttoken.kbcli", "add_parser"),
    "bench": ("firsttoken.bench.cli", "add_parser"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `firsttoken` parser; with `command` (one of COMMAND_MODULES), the other modules'
    subcommands are left out."""
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

    def add_from_module(name: str) -> None:
        if command in (None, name):
            module, function = COMMAND_MODULES[name]
            getattr(importlib.import_module(module), function)(sub)

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

    p = add(
        "worker",
        _cmd_worker,
        "Run one Celery worker process for the given queues (`celery -A workers.app worker`).",
    )
    p.add_argument(
        "--queues",
        default=CHAT_QUEUE,
        help=f"comma-separated queues: {', '.join(QUEUES)} (default {CHAT_QUEUE}); "
        f"{CHAT_QUEUE} is interactive, {BULK_QUEUE} durable writes",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="chats in flight on a chat worker (default FIRSTTOKEN_CHAT_CONCURRENCY), or "
        "threads of a bulk or summarize worker (default FIRSTTOKEN_BULK_CONCURRENCY)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="Celery node name, as `celery inspect` shows it (default QUEUES@hostname; "
        "%%h is the host name)",
    )
    p.add_argument(
        "--loglevel",
        default="warning",
        help="Celery log level: debug, info, warning (default), error",
    )
    p.add_argument(
        "--events",
        action="store_true",
        help="send task events and worker heartbeats (Celery's -E), for Flower or "
        "`celery events`; off by default",
    )

    add("migrate", _cmd_migrate, "Apply database migrations (FIRSTTOKEN_DATABASE_URL).")

    add_from_module("keys")

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
    p.add_argument(
        "--openai",
        action="store_true",
        help="ask through the OpenAI door (POST /v1/chat/completions) with the official "
        "openai SDK instead of the websocket",
    )

    p = add(
        "sim-server",
        _cmd_sim_server,
        "Run the simulated OpenAI-compatible engine (see `firsttoken sim-server --help`).",
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options for the simulator")

    add_from_module("cache")
    add_from_module("usage")
    add_from_module("workers")
    add_from_module("metrics-server")
    add_from_module("kb")
    add_from_module("bench")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim-server"]:
        # The simulator parses its own options (argparse.REMAINDER would miss leading flags).
        rest = argv[1:]
        args = argparse.Namespace(fn=_cmd_sim_server, rest=rest[1:] if rest[:1] == ["--"] else rest)
    else:
        command = argv[0] if argv[:1] and argv[0] in COMMAND_MODULES else None
        args = build_parser(command).parse_args(argv)
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"firsttoken: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
