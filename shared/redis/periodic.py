"""A background loop that does one step against Redis every so often, and goes on whatever a
step meets: Redis out of reach is told by the loop's OutageLog (shared/logs.py: a line when
the outage starts, a reminder, a line when it ends, never one per try), any other failure is
one WARNING with its traceback (a bug keeps its traceback). Only cancelling the task ends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

from shared.logs import OutageLog
from shared.redis.client import UNREACHABLE


async def every(
    interval_s: float,
    step: Callable[[], Awaitable[object]],
    logger: logging.Logger,
    what: str,
    *,
    at_once: bool = False,
) -> NoReturn:
    """Run `step` every `interval_s` (the first one after an interval, or `at_once`); `what`
    names the loop in its log lines."""
    outage = OutageLog(logger, what)
    if at_once:
        await _step(step, logger, what, outage)
    while True:
        await asyncio.sleep(interval_s)
        await _step(step, logger, what, outage)


async def _step(
    step: Callable[[], Awaitable[object]], logger: logging.Logger, what: str, outage: OutageLog
) -> None:
    try:
        await step()
    except UNREACHABLE as exc:
        outage.failed(exc)
    except Exception:
        logger.warning("%s failed", what, exc_info=True)
    else:
        outage.ok()
