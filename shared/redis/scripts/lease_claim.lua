-- lease_claim: a survivor takes over a lost chat worker's chats: moves up to ARGV[4] leases
-- from the lost worker to this one and returns them. Atomic, so two survivors never take the
-- same chat, and nothing is taken from a worker whose beat came back meanwhile. A lost worker
-- left with no lease leaves the heartbeats, so it is neither looked at again nor counted by
-- the gateways. Run by workers/chat/failover.py.
--
-- KEYS[1]  the chat workers' heartbeats (zset: worker -> last beat, unix s)
-- KEYS[2]  the lost worker's leases (hash: job id -> ChatJob payload)
-- KEYS[3]  this worker's leases
-- ARGV[1]  the lost worker's name
-- ARGV[2]  the heartbeat horizon (unix s: a beat at or after it is alive)
-- ARGV[3]  this worker's leases' ttl, s
-- ARGV[4]  the most chats to take
-- Returns {job id, payload, job id, payload, ...} of the chats taken ({} if none).

local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if beat and tonumber(beat) >= tonumber(ARGV[2]) then return {} end
local held = redis.call('HGETALL', KEYS[2])
local most, out = tonumber(ARGV[4]) * 2, {}
for i = 1, #held, 2 do
  if #out >= most then break end
  out[#out + 1] = held[i]
  out[#out + 1] = held[i + 1]
  redis.call('HSET', KEYS[3], held[i], held[i + 1])
  redis.call('HDEL', KEYS[2], held[i])
end
if #out > 0 then redis.call('EXPIRE', KEYS[3], ARGV[3]) end
if redis.call('HLEN', KEYS[2]) == 0 then redis.call('ZREM', KEYS[1], ARGV[1]) end
return out
