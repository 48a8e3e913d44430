-- lease_hold: records a chat as this chat worker's (its lease, with what a survivor needs to
-- run it again) and renews the leases hash's expiry. Run by workers/chat/failover.py.
--
-- KEYS[1]  this worker's leases (hash: job id -> ChatJob payload)
-- ARGV[1]  the job id
-- ARGV[2]  the ChatJob payload (JSON)
-- ARGV[3]  the leases' ttl, s
-- Returns 1.

redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
