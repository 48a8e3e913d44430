-- usage_queue: pushes a bulk task carrying usage rows and moves those rows' due time on, as
-- one step: a sweep never sends a row whose task was just queued, and XX leaves out a row
-- written (and removed) meanwhile. Run by workers/chat/usage.py, workers/bulk/sweep.py and
-- gateway/lostchats.py.
--
-- KEYS[1]  the bulk queue's list
-- KEYS[2]  the outbox's due times (zset)
-- ARGV[1]  the task message
-- ARGV[2]  due after, ms
-- ARGV[3..] the task's request_ids
-- Returns the number of request_ids.

redis.call('LPUSH', KEYS[1], ARGV[1])
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
for i = 3, #ARGV do redis.call('ZADD', KEYS[2], 'XX', due, ARGV[i]) end
return #ARGV - 2
