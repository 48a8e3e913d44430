-- rate_renew: extends the leases of the streams a gateway still relays (XX: an ended stream
-- stays ended). Run by gateway/ratelimit.py a few times per lease.
--
-- KEYS[1..n]  the streams set (zset) of each stream's key
-- ARGV[1]     the lease, ms
-- ARGV[2..n+1] the job id of each stream, in KEYS' order
-- Returns the number of keys (n).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], lease)
end
return #KEYS
