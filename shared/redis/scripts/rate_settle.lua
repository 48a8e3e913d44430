-- rate_settle: sets a finished chat's token charge to what it really used and frees its stream
-- slot. A request already evicted from a window is no longer counted there, so it is left
-- alone. Absolute, so running it twice changes nothing. Run by gateway/ratelimit.py.
--
-- KEYS[1]  the key's tokens (hash: request id -> tokens, and '=sum')
-- KEYS[2]  the tenant's tokens
-- KEYS[3]  the key's streams (zset)
-- ARGV[1]  the request (job) id
-- ARGV[2]  tokens charged in the end
-- Returns 1.

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
