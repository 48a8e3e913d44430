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
