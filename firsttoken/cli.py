"""The `firsttoken` command. It sits above `gateway/` and `workers/` and starts them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.errors import ConfigError
from shared.keys import BULK_QUEUE, CHAT_QUEUE, QUEUES

if TYPE_CHECKING:
    from shared.settings import Settings


def _cmd_up(args: argparse.Namespace) -> int:
    from firsttoken.up import run_up

    return run_up(port=args.port, host=args.host, drain=args.drain)


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
    sent only with `events`. With no `name`, a unique one (firsttoken/workername.py)."""
    from firsttoken.workername import default_name, procfile_environ

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
        name or default_name(queues, procfile_environ(), os.getpid()),
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
    refused = _name_taken(settings, args.name)
    if refused:
        print(refused, file=sys.stderr)
        return 1
    if args.embedded:
        _quiet_root_warning()
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


def _name_taken(settings: Settings, name: str | None) -> str | None:
    """The refusal line when a live worker already has `name`; None to go on (after a wait
    when the name's heartbeat is this process's dead predecessor's, firsttoken/workername.py).
    A default name carries this process's pid, so only an explicit one is looked up. Redis not
    answering is no reason to refuse: Celery retries its connection at start (a worker started
    before its Redis, as under docker compose), and its name is checked against nothing then."""
    if name is None:
        return None
    import asyncio
    import socket
    import time

    from firsttoken.workername import find_live, node_name, pid_running, refusal
    from shared.redis.client import UNREACHABLE

    node = node_name(name)
    host, pid = socket.gethostname(), os.getpid()
    waited = False
    while True:
        try:
            live = asyncio.run(find_live(settings, node))
        except UNREACHABLE as exc:
            print(
                f"firsttoken worker: could not check that no live worker is named {name} "
                f"(Redis: {exc}); starting anyway",
                file=sys.stderr,
            )
            return None
        if live is None:
            return None
        if waited or not live.is_dead_predecessor(host, pid, pid_running):
            return refusal(live)
        wait_s = settings.worker_lost_s - live.age_s + settings.worker_heartbeat_s
        print(
            f"firsttoken worker: the last worker named {node} (pid {live.pid}) is gone; "
            f"starting in {wait_s:.1f}s, once other workers have taken its chats over",
            file=sys.stderr,
        )
        time.sleep(max(0.0, wait_s))
        waited = True


def _quiet_root_warning() -> None:
    """`firsttoken up`'s workers: no SecurityWarning for running as root. Celery warns (once
    per worker, a 7-line block each) whenever uid 0 starts a worker, which is every `up` in a
    container or on a root shell; the danger it guards against, pickle as root, cannot occur
    here: the app accepts JSON only (workers/app.py), and Celery refuses to start at all with
    pickle as root. Deployed workers (`firsttoken worker` alone, the Procfile, Kubernetes)
    keep the warning: there, running as root is worth hearing about."""
    import warnings

    from celery.exceptions import SecurityWarning

    warnings.filterwarnings(
        "ignore", message="You're running the worker with superuser", category=SecurityWarning
    )


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

    question = args.question
    if question == "-":
        question = sys.stdin.read().strip()
        if not question:
            print(
                "firsttoken chat: no question on stdin (`chat -` reads it from there)",
                file=sys.stderr,
            )
            return 2
    return run_chat(
        question,
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        max_tokens=args.max_tokens,
        no_cache=args.no_cache,
        openai=args.openai,
    )


def _cmd_celery(args: argparse.Namespace) -> int:
    """`celery -A workers.app ARGS`, pointed at the stack: the environment, else the running
    `firsttoken up`'s Redis and prefix (main() filled them in and said which)."""
    if not args.rest:
        print(
            "firsttoken celery: give celery's arguments, e.g. `firsttoken celery inspect ping`",
            file=sys.stderr,
        )
        return 2
    argv = [sys.executable, "-m", "celery", "-A", "workers.app", *args.rest]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # its signals and exit code are celery's own


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
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (first, before the command)",
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
    p.add_argument(
        "--drain",
        action="store_true",
        help="on Ctrl-C, let in-flight chats finish (up to the workers' 30 s grace) before "
        "stopping; without it everything stops within 2 s",
    )

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
        help="Celery node name, as `celery inspect` shows it (default QUEUES-PID@hostname, "
        "or PROCESS-PID@hostname under foreman, whose PS names the Procfile process; %%h is "
        "the host name); a worker refuses a name a live worker already has",
    )
    # `firsttoken up`'s workers (see _quiet_root_warning); not for operators.
    p.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
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
    p.add_argument("question", help="the question; - reads it from stdin")
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
        "celery",
        _cmd_celery,
        "Run `celery -A workers.app ARGS` against this stack (FIRSTTOKEN_REDIS_URL and "
        "_PREFIX, else the `firsttoken up` running in this directory), e.g. "
        "`firsttoken celery inspect ping`.",
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help="celery's arguments")

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


# Commands that take the running `firsttoken up`'s addresses (firsttoken/stackfile.py) where
# the environment names none; those that read Redis say on stderr which one.
NOT_BESIDE_UP = frozenset({"up", "sim-server", "bench", "chat"})
SAY_WHICH_REDIS = frozenset({"workers", "keys", "celery", "cache"})
# Commands whose arguments are another program's, passed on as they are.
PASS_THROUGH = {"sim-server": _cmd_sim_server, "celery": _cmd_celery}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = argv[:1] == ["--debug"]
    argv = argv[1:] if debug else argv
    if argv[:1] and argv[0] in PASS_THROUGH:
        # argparse.REMAINDER would miss leading flags: the rest goes on untouched.
        rest = argv[1:]
        args = argparse.Namespace(
            fn=PASS_THROUGH[argv[0]], rest=rest[1:] if rest[:1] == ["--"] else rest
        )
    else:
        command = argv[0] if argv[:1] and argv[0] in COMMAND_MODULES else None
        args = build_parser(command).parse_args(argv)
    try:
        if argv[0] not in NOT_BESIDE_UP:
            from firsttoken import stackfile

            line = stackfile.apply(os.environ)
            if argv[0] in SAY_WHICH_REDIS:
                print(line, file=sys.stderr, flush=True)
        return int(args.fn(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the edge: every error becomes one line
        from firsttoken.clierrors import explain

        if debug:
            traceback.print_exc()
        print(f"firsttoken: {explain(exc, os.environ)}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
