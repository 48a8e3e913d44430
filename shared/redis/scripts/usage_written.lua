-- usage_written: takes rows whose transaction committed out of the outbox. Run by
-- workers/bulk/persist.py.
--
-- KEYS[1]  the outbox's due times (zset)
-- KEYS[2]  the outbox's rows (hash)
-- ARGV[1..] request_ids whose rows have committed
-- Returns the number of request_ids.

for i = 1, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return #ARGV
