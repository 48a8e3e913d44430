"""What the cache's background verification costs the tenant (issue 45): each engine call it
makes (the re-ask of a sampled hit, the LLM judge's question) is charged to the tenant's rate
limits before it is sent and billed once it has been answered.

The mechanism, and why:

- **The tenant's own window, through the gateway's own script.** A call is admitted by
  shared/redis/scripts/rate_admit.lua against the tenant's requests and tokens per minute,
  exactly as a chat is: one request, and its prompt estimate plus ``max_tokens`` reserved in the
  same sliding window. "The tenant's limits" then mean one thing whoever spends them, hold
  across any number of gateways and workers, and need no second allowance to configure or
  explain. The limits are the ones the gateway enforced on the chat (ChatJob.tenant_rpm/_tpm);
  a job from an older gateway without them is charged at this deployment's defaults.
- **Not the key's limits, nor its stream slots.** Those pace one client's own calls; a
  verification is no call of the client's, and taking one of its stream slots would refuse a
  chat the client counted on. The key's revocation still counts: a revoked key's tenant gets no
  verification of its chats.
- **Refused means skipped.** A call the window refuses is not sent, queued or retried: it is a
  sample, and another will come. It is counted (``skipped_limit``, `firsttoken cache report`).
  A tenant at its limit therefore gets no verification while it is there, and a verification
  can only take room in the window that is free when it starts. That room is then the
  tenant's chats' no longer: one request per sampled hit (``cache_verify_rate`` of its
  semantic hits), and with the LLM judge one more per verdict, a near miss's included.
- **Settled, then billed.** Once answered, the reservation is set to the tokens the engine
  counted (rate_settle.lua), as a chat's is, and one usage row goes to the bulk pool: door
  ``verify`` (route ``verify``, or ``verify-judge`` for the judge's question), no cache tier (it
  was no lookup), its cost at the model's prices, so that `firsttoken usage --by door` shows
  verification's spend apart from the chats'. A call that did not finish (an engine error, the
  timeout) writes no row, and its reservation stays until the window drops it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.keys import Keys
from shared.modeltable import ModelTable
from shared.protocol import Message
from shared.ratewindow import WINDOW_MS, estimate_prompt_tokens
from shared.redis import scripts
from shared.settings import Settings
from shared.tasks import ChatJob, UsageRecord
from shared.timing import elapsed_ms
from shared.usage_row import usage_row as shared_usage_row
from workers.resources import WorkerContext

Call = Literal["reask", "judge"]

DOOR = "verify"
ROUTES: dict[Call, str] = {"reask": "verify", "judge": "verify-judge"}
# How long a charged entry outlives the window (rate_admit's lease argument): no stream slot is
# taken, so only the keys' expiry uses it.
_LEASE_MS = 1000
# Entries an eviction touches per Redis call (rate_admit's ARGV[10], as the gateway passes).
_BATCH = 500


@dataclass(frozen=True, slots=True)
class Answered:
    """One engine call's answer and what the engine counted (None: not reported)."""

    text: str
    finish_reason: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_prompt_tokens: int | None = None


def request_id(job: ChatJob, call: Call) -> str:
    """The call's id in the window and its usage row's request id (a chat's own row has the
    job id; a job makes each call at most once)."""
    return f"{job.job_id}-{call}"


def tenant_limits(job: ChatJob, settings: Settings) -> tuple[int, int]:
    """The tenant's requests and tokens per minute (0: none) for this job's verification."""
    rpm = settings.tenant_rpm_default if job.tenant_rpm is None else job.tenant_rpm
    tpm = settings.tenant_tpm_default if job.tenant_tpm is None else job.tenant_tpm
    return rpm, tpm


def reservation(messages: Sequence[Message], max_tokens: int) -> int:
    """Tokens held at admission, as the gateway holds a chat's: the prompt estimate plus the
    longest answer allowed."""
    return estimate_prompt_tokens(m.content for m in messages) + max_tokens


def charged(answered: Answered, reserved: int) -> int:
    """Tokens the call keeps charged once answered: what the engine counted, else (an engine
    that reports no usage) the whole reservation, as the stricter of the two."""
    if answered.prompt_tokens is None or answered.completion_tokens is None:
        return reserved
    return max(0, answered.prompt_tokens + answered.completion_tokens)


def usage_row(
    models: ModelTable,
    job: ChatJob,
    call: Call,
    model: str,
    answered: Answered,
    *,
    prompt_estimate: int,
    started: float,
    finished: float,
) -> UsageRecord:
    """The call's usage row: billed to the chat's tenant and key, marked door ``verify``; built
    by the one builder of every usage row (shared/usage_row.py), as the call's own job."""
    ending = _Ending(
        model=model,
        finish_reason=answered.finish_reason,
        route=ROUTES[call],
        prompt_tokens=(
            answered.prompt_tokens if answered.prompt_tokens is not None else prompt_estimate
        ),
        completion_tokens=answered.completion_tokens or 0,
        cached_prompt_tokens=answered.cached_prompt_tokens,
    )
    own = job.model_copy(update={"job_id": request_id(job, call), "door": DOOR})
    return shared_usage_row(
        models,
        own,
        ending,
        queue_ms=None,
        ttft_ms=None,
        total_ms=elapsed_ms(finished, started),
        now=finished,
    )


@dataclass(frozen=True, slots=True)
class _Ending:
    """How a verification call ended, as shared/usage_row.py's Ending reads it: answered, by
    the engine, no cache lookup of its own."""

    model: str
    finish_reason: str
    route: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int | None
    status: str = "ok"
    cached: bool = False
    cache_tier: str | None = None


class Charges:
    """Admission, settlement and billing of verification calls (the I/O of this module)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.keys: Keys = ctx.keys

    async def admit(self, job: ChatJob, call: Call, tokens: int) -> bool:
        """Charge one request and ``tokens`` to the tenant's window; False when refused."""
        rpm, tpm = tenant_limits(job, self.ctx.settings)
        keys = self.keys.admission_keys(job.key_id, job.tenant_id)
        # The key's limits and stream slots 0: only the tenant's are charged (see above).
        args: list[str | int] = [request_id(job, call), tokens, 0, 0, rpm, tpm, 0]
        args += [WINDOW_MS, _LEASE_MS, _BATCH]
        result = await scripts.run(self.ctx.redis, scripts.RATE_ADMIT, keys, args)
        return int(result[0]) == 1

    async def settle(self, job: ChatJob, call: Call, tokens: int) -> None:
        k = self.keys
        await scripts.run(
            self.ctx.redis,
            scripts.RATE_SETTLE,
            [
                k.rate_tokens("key", job.key_id),
                k.rate_tokens("tenant", job.tenant_id),
                k.key_streams(job.key_id),
            ],
            [request_id(job, call), tokens],
        )

    def bill(
        self,
        job: ChatJob,
        call: Call,
        model: str,
        answered: Answered,
        *,
        prompt_estimate: int,
        started: float,
    ) -> None:
        self.ctx.usage.add(
            usage_row(
                self.ctx.models,
                job,
                call,
                model,
                answered,
                prompt_estimate=prompt_estimate,
                started=started,
                finished=time.time(),
            )
        )
