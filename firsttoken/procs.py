"""A child process of the benchmark or the test suite: its own session, output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Child:
    """Started in a new process session, so stop() and kill() reach its whole group."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            args,
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a shutdown)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)
        self._log.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass
        self._log.close()


def gateway_args(port: int, count: int = 1) -> dict[str, list[str]]:
    """Python arguments of `count` gateway processes on `port`, by child name: one is
    "gateway"; several are gateway0, gateway1... sharing the port (`--reuse-port`)."""
    args = ["-m", "gateway", "--port", str(port)]
    if count == 1:
        return {"gateway": args}
    return {f"gateway{i}": [*args, "--reuse-port"] for i in range(count)}


def worker_args(
    queues: str, *, name: str | None = None, concurrency: int | None = None
) -> list[str]:
    """Python arguments of one worker process on `queues` (comma-separated): a Celery worker,
    `firsttoken worker` (see firsttoken/cli.py), the chat pool included."""
    args = ["-m", "firsttoken", "worker", "--queues", queues]
    if name is not None:
        args += ["--name", name]
    if concurrency is not None:
        args += ["--concurrency", str(concurrency)]
    return args


def stop_all(children: list[Child]) -> None:
    """Stop every child in turn. Interrupted meanwhile (a second Ctrl-C or SIGTERM, raised as
    KeyboardInterrupt), it kills the rest at once instead of leaving them running, and raises
    the interrupt once every child is gone."""
    interrupted: KeyboardInterrupt | None = None
    for child in children:
        while True:
            try:
                if interrupted is None:
                    child.stop()
                else:
                    child.kill()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if interrupted is not None:
        raise interrupted
