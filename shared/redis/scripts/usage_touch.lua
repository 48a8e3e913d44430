-- usage_touch: moves the due time of rows on (XX: only rows still in the outbox): a task
-- waiting out a retry (the database is down) still holds its rows, so no sweep is to send
-- them again meanwhile. Run by workers/bulk/persist.py.
--
-- KEYS[1]  the outbox's due times (zset)
-- ARGV[1]  due after, ms
-- ARGV[2..] request_ids
-- Returns the number of request_ids.

local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', due, ARGV[i]) end
return #ARGV - 1
