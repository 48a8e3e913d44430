-- rate_admit: admits one chat against every rate limit of its key and its tenant (requests
-- and tokens per minute in sliding windows, the key's concurrent stream leases, the key's
-- revocation marker), charging all of them at once or none; optionally enqueues the admitted
-- chat (LPUSH of its Celery message) and records its owner in the same step, so admission and
-- enqueue are one round trip and a refused chat never reaches the queue. The clock is Redis's
-- own (TIME). Idempotent per job: run again for a job already admitted (a resend after a lost
-- connection) it returns {1} and charges and enqueues nothing (the owner record is the receipt).
-- Run by gateway/ratelimit.py on the gateway's pipe; the arithmetic is gateway/rates.py's.
--
-- KEYS[1]  the key's request window (zset: request id -> admitted at, ms)
-- KEYS[2]  the key's tokens (hash: request id -> tokens, and '=sum')
-- KEYS[3]  the tenant's request window
-- KEYS[4]  the tenant's tokens
-- KEYS[5]  the key's streams (zset: request id -> lease end, ms)
-- KEYS[6]  the key's revoked marker
-- KEYS[7]  optional: the queue list to enqueue the admitted chat on
-- KEYS[8]  optional (with 7): the job's owner record
-- KEYS[9]  optional (with 7, 8): the job's followers set
-- ARGV[1]  the request (job) id
-- ARGV[2]  tokens to charge
-- ARGV[3]  the key's requests per minute (0: unlimited)
-- ARGV[4]  the key's tokens per minute (0: unlimited)
-- ARGV[5]  the tenant's requests per minute (0: unlimited)
-- ARGV[6]  the tenant's tokens per minute (0: unlimited)
-- ARGV[7]  the key's most concurrent streams (0: unlimited)
-- ARGV[8]  the window, ms
-- ARGV[9]  the stream lease, ms
-- ARGV[10] most entries an eviction or scan touches per Redis call (Lua's unpack() has a
--          stack limit of a few thousand values)
-- ARGV[11] with KEYS[7]: the task message to push
-- ARGV[12] with KEYS[7]: the owner's key id (the owner record's value)
-- ARGV[13] with KEYS[7]: the owner record's (and followers set's) ttl, s
-- ARGV[14] with KEYS[9]: the admitting gateway's name (the followers set's first member)
--          (gateway/jobs.py: a gateway giving the job up cancels it only when no other
--          gateway follows it)
-- Returns {1} admitted, {0, reason ('rpm'|'tpm'|'streams'), scope ('key'|'tenant'),
-- retry after ms} refused, {-1} the key is revoked.

if KEYS[8] and redis.call('EXISTS', KEYS[8]) == 1 then return {1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local need = tonumber(ARGV[2])
local window = tonumber(ARGV[8])
local lease = tonumber(ARGV[9])
local per_call = tonumber(ARGV[10])
local horizon = now - window

if redis.call('EXISTS', KEYS[6]) == 1 then return {-1} end

local function evict(w, h)
  while true do
    local old = redis.call('ZRANGEBYSCORE', w, '-inf', horizon, 'LIMIT', 0, per_call)
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
        local batch = redis.call('ZRANGE', w, start, start + per_call - 1, 'WITHSCORES')
        if #batch == 0 then break end
        local ids = {}
        for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
        local amounts = redis.call('HMGET', h, unpack(ids))
        for i = 1, #ids do
          used = used - (tonumber(amounts[i]) or 0)
          if used + need <= tpm then
            return 'tpm', math.max(1, tonumber(batch[2 * i]) + window - now)
          end
        end
        start = start + per_call
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
  if reason then return {0, reason, 'key', wait} end
end
if track_tenant then
  local reason, wait = check(KEYS[3], KEYS[4], ten_rpm, ten_tpm)
  if reason then return {0, reason, 'tenant', wait} end
end
if max_streams > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  if redis.call('ZCARD', KEYS[5]) >= max_streams then
    -- Streams end at unknown times (their leases only bound a crashed gateway's), so the
    -- client is told to try again shortly rather than when the oldest lease would expire.
    return {0, 'streams', 'key', 1000}
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
  redis.call('SET', KEYS[8], ARGV[12], 'EX', tonumber(ARGV[13]))
  if KEYS[9] then
    redis.call('SADD', KEYS[9], ARGV[14])
    redis.call('EXPIRE', KEYS[9], tonumber(ARGV[13]))
  end
  redis.call('LPUSH', KEYS[7], ARGV[11])
end
return {1}
