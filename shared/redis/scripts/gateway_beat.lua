-- gateway_beat: a gateway's heartbeat: sets its score in the gateways set to Redis's clock
-- (TIME) and drops members silent for longer than the forget time; or, with ARGV[3], removes
-- it (a clean stop). Run by gateway/liveness.py on the gateway's pipe.
--
-- KEYS[1]  the gateways set (zset: gateway name -> last beat, ms)
-- ARGV[1]  this gateway's name
-- ARGV[2]  forget members silent this long, ms
-- ARGV[3]  optional: present (1) to leave the set instead of beating
-- Returns 1 after a beat; after a leave, the number of members removed (0 or 1).

if ARGV[3] then return redis.call('ZREM', KEYS[1], ARGV[1]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return 1
