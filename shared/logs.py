"""Logging of firsttoken's processes, and its one rule: prompt and answer text never reach a
log line, at any level.

firsttoken's own code logs ids, counts, lengths and error types, never message content
(payload models hide their input in validation errors, SQL errors hide their bound values).
Two libraries would print content at DEBUG, so their loggers are held at INFO whatever the
process's level: Celery's ``celery.pool`` (every task it applies, with the task's body, hence a
turn's messages) and websockets' frame tracing (each frame's text).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

OWN_LOGGERS = ("gateway", "workers", "shared", "firsttoken")
# Libraries that log message bodies at DEBUG.
CONTENT_AT_DEBUG = ("celery.pool", "websockets")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def hold_content_loggers() -> None:
    """Keep the libraries' body-logging DEBUG lines off, whatever the root level."""
    for name in CONTENT_AT_DEBUG:
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:
            logger.setLevel(logging.INFO)


def configure_logging(level: str) -> None:
    """firsttoken's own loggers at `level`, to stderr (a process whose server does not set
    up logging, the gateway under uvicorn); the content-bearing library loggers held."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    hold_content_loggers()


# How often a loop still failing against an unreachable service says so again.
OUTAGE_REMINDER_S = 30.0


class OutageLog:
    """The log of one loop's outage of a service it polls (Redis, mostly): one WARNING when it
    starts, a reminder every `remind_s` while it lasts, one line when it ends. A loop that
    retries every 0.1-1 s otherwise writes a line (or a traceback) per try: hundreds of
    tracebacks per process for one Redis restart (issue 42).

    A lone failed try is no outage and says nothing: right after Redis returns, a pooled
    connection that died with the old server fails once more, then the pool opens a new one.
    The outage is told at its second failed try in a row, and its time counted from the first.

    Only unreachability goes through here: a loop's bugs keep their tracebacks. One instance
    per loop (per process per subsystem); `clock` is injectable for the tests."""

    __slots__ = (
        "_clock",
        "_failures",
        "_last_said",
        "_log",
        "_remind_s",
        "_service",
        "_since",
        "_told",
        "_what",
    )

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        service: str = "Redis",
        remind_s: float = OUTAGE_REMINDER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._what, self._service = logger, what, service
        self._remind_s, self._clock = remind_s, clock
        self._since: float | None = None  # when the outage began (None: no outage)
        self._last_said = 0.0
        self._failures = 0
        self._told = False  # the outage's first line is written

    @property
    def down(self) -> bool:
        return self._told

    def failed(self, exc: BaseException) -> None:
        """One try failed because the service is out of reach."""
        now = self._clock()
        self._failures += 1
        if self._since is None:
            self._since = now  # maybe a lone failure: said at the next one in a row
        elif not self._told:
            self._told, self._last_said = True, now
            self._log.warning(
                "%s: %s unreachable (%s); retrying quietly, a reminder every %gs",
                self._what,
                self._service,
                _reason(exc),
                self._remind_s,
            )
        elif now - self._last_said >= self._remind_s:
            self._last_said = now
            self._log.warning(
                "%s: %s still unreachable after %.0fs (%d failed tries; last: %s)",
                self._what,
                self._service,
                now - self._since,
                self._failures,
                _reason(exc),
            )

    def ok(self) -> None:
        """One try succeeded: an outage in progress has ended."""
        if self._since is None:
            return
        if self._told:
            self._log.warning(
                "%s: %s reachable again after %.1fs (%d failed tries)",
                self._what,
                self._service,
                self._clock() - self._since,
                self._failures,
            )
        self._since, self._failures, self._told = None, 0, False


def _reason(exc: BaseException) -> str:
    """The error's type and message on one line, cut short (never a traceback)."""
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
