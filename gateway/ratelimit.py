"""Rate limits enforced atomically in Redis: one EVALSHA per chat admits or refuses it.

Every limit of a chat (requests and tokens per minute for its key and its tenant, concurrent
streams for its key, and the key's revocation marker) is checked and charged by one Lua script,
so they hold exactly with any number of gateway processes and cost one round trip. The clock is
Redis's own (``TIME``), so gateways with skewed clocks still share one window.

The scripts (shared/redis/scripts/rate_*.lua) run on the gateway's Redis pipe
(shared/redis/pipe.py): a burst of chats is admitted with one write and no pooled connection
per chat. The pipe sends a call again after a lost connection, so each script may run twice:
admission is idempotent per job (an admitted job's owner record is its receipt) and
settlement sets an absolute amount.

The arithmetic is the reference model in ``gateway/rates.py``; this module only moves it into
Redis. A stream slot is a lease (``stream_lease_s``) that the gateway renews while the stream
runs, so a gateway that crashes leaks its slots only until their leases run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from gateway.rates import WINDOW_MS, Limits
from shared.errors import Overloaded, RateLimited, Unauthorized
from shared.keys import Keys
from shared.redis import scripts
from shared.redis.client import REDIS_RETRY_AFTER_MS
from shared.redis.periodic import every
from shared.redis.pipe import RedisPipe

log = logging.getLogger(__name__)

# Evictions and scans touch at most this many entries per Redis call (Lua's unpack() has a
# stack limit of a few thousand values): rate_admit's ARGV[10]; and renewals this many streams.
_BATCH = 500

_REASONS = {
    "rpm": "requests per minute",
    "tpm": "tokens per minute",
    "streams": "concurrent streams",
}


@dataclass(frozen=True, slots=True)
class Enqueue:
    """The Celery message to push once admitted, and where the job's owner is recorded."""

    queue_key: str
    message: str
    owner_key: str
    owner_ttl_s: int
    # The job's followers set and the admitting gateway's name in it (None: not recorded).
    followers_key: str | None = None
    follower: str = ""


@dataclass(slots=True)
class Admission:
    """One admitted chat: what it holds until :meth:`RateLimiter.settle` gives it back."""

    job_id: str
    key_id: str
    tenant_id: str
    reserved: int
    prompt_estimate: int
    streams: bool
    settled: bool = field(default=False)


class RateLimiter:
    def __init__(
        self, pipe: RedisPipe, keys: Keys, lease_s: float, *, timeout_s: float = 5.0
    ) -> None:
        self._pipe = pipe
        self._keys = keys
        self._lease_ms = max(1000, int(lease_s * 1000))
        self._timeout_s = timeout_s
        self._admit = pipe.script(scripts.RATE_ADMIT)
        self._settle = pipe.script(scripts.RATE_SETTLE)
        self._renew = pipe.script(scripts.RATE_RENEW)
        self.live: dict[str, Admission] = {}  # job id -> admission holding a stream slot
        self._renewer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._renewer = asyncio.create_task(self._renew_loop())

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(BaseException):
                await self._renewer

    async def admit(
        self,
        *,
        job_id: str,
        key_id: str,
        tenant_id: str,
        limits: Limits,
        tokens: int,
        prompt_estimate: int,
        enqueue: Enqueue | None = None,
    ) -> Admission:
        """Charge one request and `tokens` against every limit, or raise RateLimited; with
        `enqueue`, an admitted chat is enqueued in the same round trip."""
        keys = self._keys.admission_keys(key_id, tenant_id)
        args: list[Any] = [
            job_id,
            tokens,
            limits.key_rpm,
            limits.key_tpm,
            limits.tenant_rpm,
            limits.tenant_tpm,
            limits.key_streams,
            WINDOW_MS,
            self._lease_ms,
            _BATCH,
        ]
        if enqueue is not None:
            keys += [enqueue.queue_key, enqueue.owner_key]
            args += [enqueue.message, key_id, enqueue.owner_ttl_s]
            if enqueue.followers_key is not None:
                keys.append(enqueue.followers_key)
                args.append(enqueue.follower)
        try:
            async with asyncio.timeout(self._timeout_s):
                # Urgent: the chat's first token waits on it.
                result: Any = await self._admit(keys, args, urgent=True)
        except TimeoutError:
            raise Overloaded(
                f"the gateway's Redis did not answer within {self._timeout_s:g}s; the chat was "
                "not started: retry shortly",
                retry_after_ms=REDIS_RETRY_AFTER_MS,
            ) from None
        except ConnectionError as exc:
            raise Overloaded(
                f"the gateway cannot reach Redis ({exc}); the chat was not started: retry shortly",
                retry_after_ms=REDIS_RETRY_AFTER_MS,
            ) from None
        status = int(result[0])
        if status == -1:
            raise Unauthorized("this API key has been revoked")
        if status == 0:
            reason, scope, wait = str(result[1]), str(result[2]), int(result[3])
            raise RateLimited(
                f"over the {scope}'s limit of {_REASONS.get(reason, reason)}; "
                f"retry in {wait / 1000:.1f}s",
                retry_after_ms=wait,
            )
        admission = Admission(
            job_id, key_id, tenant_id, tokens, prompt_estimate, limits.key_streams > 0
        )
        if admission.streams:
            self.live[job_id] = admission
        return admission

    def settle(self, admission: Admission, charged: int) -> None:
        """Set the admission's tokens to what was charged and free its stream slot (once).

        Queued on the pipe; nothing waits for the answer (an error reply is logged there)."""
        if admission.settled:
            return
        admission.settled = True
        self.live.pop(admission.job_id, None)
        k = self._keys
        try:
            self._settle.send(
                [
                    k.rate_tokens("key", admission.key_id),
                    k.rate_tokens("tenant", admission.tenant_id),
                    k.key_streams(admission.key_id),
                ],
                [admission.job_id, charged],
            )
        except ConnectionError:
            # The lease and the window both expire on their own; a lost refund only makes the
            # limit stricter for at most one window.
            log.warning("could not settle rate-limit reservation", exc_info=True)

    async def flush(self) -> None:
        """Wait until every settlement sent so far has run."""
        await self._pipe.flush()

    async def renew(self) -> None:
        """Extend the lease of every stream this process is still relaying."""
        live = list(self.live.values())
        for i in range(0, len(live), _BATCH):
            batch = live[i : i + _BATCH]
            async with asyncio.timeout(self._timeout_s):
                await self._renew(
                    [self._keys.key_streams(a.key_id) for a in batch],
                    [self._lease_ms, *(a.job_id for a in batch)],
                )

    async def _renew_loop(self) -> None:
        # Three renewals per lease: one lost to a Redis blip does not expire a live stream.
        await every(self._lease_ms / 3000, self.renew, log, "stream lease renewal")
