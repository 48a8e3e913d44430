-- usage_claim: a sweep takes the outbox's rows past due, moving their due time on (so a second
-- sweeper does not take them too); a due entry whose row is gone is dropped. While the bulk
-- queue is longer than the limit the rows are most likely in it, behind the others: sending
-- them again would only lengthen it, so nothing is taken. Run by workers/bulk/sweep.py.
--
-- KEYS[1]  the outbox's due times (zset: request_id -> due, ms)
-- KEYS[2]  the outbox's rows (hash: request_id -> row JSON)
-- KEYS[3]  the bulk queue's list
-- ARGV[1]  the most rows to take
-- ARGV[2]  due after, ms (the rows' new due time)
-- ARGV[3]  the longest queue (messages) at which a sweep still takes rows
-- Returns {request_id, row JSON, ...} of the rows taken ({} if none).

if redis.call('LLEN', KEYS[3]) > tonumber(ARGV[3]) then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(ids) do
  local row = redis.call('HGET', KEYS[2], id)
  if row then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    out[#out + 1] = id
    out[#out + 1] = row
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
