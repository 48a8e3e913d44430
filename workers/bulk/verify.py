"""The cache-verify task (issue 45): a chat worker's sample of its semantic hits, checked
against the engine here, in the bulk pool (workers/cache/checker.py says how).

The task only hands the check to the process loop and returns: a check waits seconds on the
engine, and a pool thread held that long would hold up the durable writes behind it. It is
acknowledged on receipt, and not among the work a stopping worker waits for: a check lost with
its worker is one sample fewer, nothing owed (the checker cancels those still running when it
closes).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from shared.keys import CACHE_VERIFY_TASK
from shared.tasks import VerifyJob
from workers.app import app
from workers.cache.checker import Checker
from workers.lifecycle import lifecycle
from workers.resources import WorkerContext
from workers.runtime import runner

log = logging.getLogger(__name__)


@app.task(name=CACHE_VERIFY_TASK)
def cache_verify(check: dict[str, Any]) -> None:
    asyncio.run_coroutine_threadsafe(_check(VerifyJob.model_validate(check)), runner.loop())


async def _check(job: VerifyJob) -> None:
    try:
        ctx = await lifecycle.context()
        await checker(ctx).check(job)
    except Exception:
        log.warning("a cache verification could not run", exc_info=True)


def checker(ctx: WorkerContext) -> Checker:
    """The process's checker, made on its first check."""
    if ctx.cache_checker is None:
        ctx.cache_checker = Checker(ctx)
    return cast(Checker, ctx.cache_checker)
