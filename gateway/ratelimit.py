"""Rate limits enforced atomically in Redis: one EVALSHA per chat admits or refuses it.

Every limit of a chat (requests and tokens per minute for its key and its tenant, concurrent
streams for its key, and the key's revocation marker) is checked and charged by one Lua script,
so they hold exactly with any number of gateway processes and cost one round trip. The clock is
Redis's own (``TIME``), so gateways with skewed clocks still share one window.

The scripts run on the gateway's Redis pipe (shared/redis/pipe.py): a burst of chats is admitted
with one write and no pooled connection per chat. The pipe sends a call again after a lost
connection, so each script may run twice: admission is idempotent per job (an admitted job's
owner record is its receipt) and settlement sets an absolute amount.

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
from shared.redis.client import REDIS_RETRY_AFTER_MS
from shared.redis.pipe import RedisPipe

log = logging.getLogger(__name__)

# Evictions and scans touch at most this many entries per Redis call (Lua's unpack() has a
# stack limit of a few thousand values).
_BATCH = 500

# KEYS: key window, key tokens, tenant window, tenant tokens, key streams, key revoked marker,
#       [queue list, job owner, [job followers]]
# ARGV: request id, tokens, key rpm, key tpm, tenant rpm, tenant tpm, max streams,
#       window ms, lease ms, [task message, owner key id, owner ttl s, [follower name]]
# Returns {1} admitted, {0, reason, scope, retry_after_ms} refused, {-1} revoked.
# With the optional keys, an admitted chat is also enqueued (LPUSH) and its owner recorded:
# admission and enqueue are then one round trip, and a refused chat never reaches the queue.
# With the followers set too, the admitting gateway is its first member (gateway/jobs.py: a
# gateway giving the job up cancels it only when no other gateway follows it).
# Run again for a job it already admitted (a resend after a lost connection), it returns {1}
# and charges and enqueues nothing: the owner record says the first run admitted it.
ADMIT_LUA = f"""
if KEYS[8] and redis.call('EXISTS', KEYS[8]) == 1 then return {{1}} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local need = tonumber(ARGV[2])
local window = tonumber(ARGV[8])
local lease = tonumber(ARGV[9])
local horizon = now - window

if redis.call('EXISTS', KEYS[6]) == 1 then return {{-1}} end

local function evict(w, h)
  while true do
    local old = redis.call('ZRANGEBYSCORE', w, '-inf', horizon, 'LIMIT', 0, {_BATCH})
    if #old == 0 then return end
    local amounts = redis.call('HMGET', h, unpack(old))
    local freed = 0
    for i = 1, #old do freed = freed + (tonumber(amounts[i]) or 0) end
    redis.call('ZREM', w, unpack(old))
    redis.call('HDEL', h, unpack(old))
    redis.call('HINCRBY', h, '=sum', -freed)
  end
end

local function check(w, h, rpm, tpm)
  evict(w, h)
  if rpm > 0 then
    local n = redis.call('ZCARD', w)
    if n >= rpm then
      local e = redis.call('ZRANGE', w, n - rpm, n - rpm, 'WITHSCORES')
      return 'rpm', math.max(1, tonumber(e[2]) + window - now)
    end
  end
  if tpm > 0 then
    local used = tonumber(redis.call('HGET', h, '=sum') or '0')
    if used + need > tpm then
      local start = 0
      while true do
        local batch = redis.call('ZRANGE', w, start, start + {_BATCH} - 1, 'WITHSCORES')
        if #batch == 0 then break end
        local ids = {{}}
        for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
        local amounts = redis.call('HMGET', h, unpack(ids))
        for i = 1, #ids do
          used = used - (tonumber(amounts[i]) or 0)
          if used + need <= tpm then
            return 'tpm', math.max(1, tonumber(batch[2 * i]) + window - now)
          end
        end
        start = start + {_BATCH}
      end
      return 'tpm', window
    end
  end
  return nil, 0
end

local key_rpm, key_tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local ten_rpm, ten_tpm = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_streams = tonumber(ARGV[7])
local track_key = key_rpm > 0 or key_tpm > 0
local track_tenant = ten_rpm > 0 or ten_tpm > 0

if track_key then
  local reason, wait = check(KEYS[1], KEYS[2], key_rpm, key_tpm)
  if reason then return {{0, reason, 'key', wait}} end
end
if track_tenant then
  local reason, wait = check(KEYS[3], KEYS[4], ten_rpm, ten_tpm)
  if reason then return {{0, reason, 'tenant', wait}} end
end
if max_streams > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  if redis.call('ZCARD', KEYS[5]) >= max_streams then
    -- Streams end at unknown times (their leases only bound a crashed gateway's), so the
    -- client is told to try again shortly rather than when the oldest lease would expire.
    return {{0, 'streams', 'key', 1000}}
  end
end

local function charge(w, h)
  redis.call('ZADD', w, now, rid)
  redis.call('HSET', h, rid, need)
  redis.call('HINCRBY', h, '=sum', need)
  redis.call('PEXPIRE', w, window + lease)
  redis.call('PEXPIRE', h, window + lease)
end
if track_key then charge(KEYS[1], KEYS[2]) end
if track_tenant then charge(KEYS[3], KEYS[4]) end
if max_streams > 0 then
  redis.call('ZADD', KEYS[5], now + lease, rid)
  redis.call('PEXPIRE', KEYS[5], lease)
end
if KEYS[7] then
  redis.call('SET', KEYS[8], ARGV[11], 'EX', tonumber(ARGV[12]))
  if KEYS[9] then
    redis.call('SADD', KEYS[9], ARGV[13])
    redis.call('EXPIRE', KEYS[9], tonumber(ARGV[12]))
  end
  redis.call('LPUSH', KEYS[7], ARGV[10])
end
return {{1}}
"""

# KEYS: key tokens, tenant tokens, key streams.  ARGV: request id, tokens charged in the end.
# A request already evicted from a window is no longer counted there, so it is left alone.
# Absolute, so running it twice changes nothing.
SETTLE_LUA = """
local rid = ARGV[1]
local charged = tonumber(ARGV[2])
for i = 1, 2 do
  local cur = redis.call('HGET', KEYS[i], rid)
  if cur then
    local new = math.max(0, charged)
    redis.call('HSET', KEYS[i], rid, new)
    redis.call('HINCRBY', KEYS[i], '=sum', new - tonumber(cur))
  end
end
redis.call('ZREM', KEYS[3], rid)
return 1
"""

# KEYS: streams sets.  ARGV: lease ms, then one job id per key.  XX: an ended stream stays ended.
RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], lease)
end
return #KEYS
"""

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
        self._admit = pipe.script(ADMIT_LUA)
        self._settle = pipe.script(SETTLE_LUA)
        self._renew = pipe.script(RENEW_LUA)
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
        k = self._keys
        keys = [
            k.rate_window("key", key_id),
            k.rate_tokens("key", key_id),
            k.rate_window("tenant", tenant_id),
            k.rate_tokens("tenant", tenant_id),
            k.key_streams(key_id),
            k.key_revoked(key_id),
        ]
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
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self.renew()
            except Exception:
                log.warning("could not renew stream leases", exc_info=True)
