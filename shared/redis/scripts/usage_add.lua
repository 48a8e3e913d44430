-- usage_add: puts usage rows into the outbox with a due time (Redis's clock): a row not in a
-- queued task by then is sent on by a bulk worker's sweep. shared/usage_outbox.py describes
-- the outbox; run by workers/chat/usage.py and gateway/lostchats.py.
--
-- KEYS[1]  the outbox's rows (hash: request_id -> row JSON)
-- KEYS[2]  the outbox's due times (zset: request_id -> due, ms)
-- ARGV[1]  due after, ms
-- ARGV[2..] request_id, row JSON pairs
-- Returns the number of rows added.

local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], due, ARGV[i])
end
return (#ARGV - 1) / 2
