"""The usage outbox: every billed row stays in Redis until a bulk worker has written it.

A usage row goes into the outbox (`Keys.usage_rows`: request_id -> the row's JSON) before its
chat's `done` is sent, with a due time (`Keys.usage_due`: request_id -> Redis time in ms). The
bulk task that carries it takes it out only after its transaction committed. Whatever loses
a row on the way (a chat worker killed before it queued the batch, kombu's Redis transport
taking a message off the list before it records it as unacked, a Redis restart without
persistence) leaves the row in the outbox past its due time, and a bulk worker's sweep queues
it again (workers/bulk/sweep.py). A row sent twice is written once: the write is idempotent
on request_id.

The scripts below are the outbox's only writers; they run on Redis so that each step is one
round trip and atomic. Time is Redis's, so hosts with skewed clocks agree.
"""

from __future__ import annotations

# KEYS: rows, due.  ARGV: due after (ms), then request_id, row JSON pairs.
# A row not in a queued task by its due time is sent on by a sweep.
ADD_LUA = """
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], due, ARGV[i])
end
return (#ARGV - 1) / 2
"""

# KEYS: the bulk queue's list, due.  ARGV: the task message, due after (ms), request_ids.
# Pushing the task and moving its rows' due time on are one step: a sweep never sends a row
# whose task was just queued, and XX leaves out a row written (and removed) meanwhile.
QUEUE_LUA = """
redis.call('LPUSH', KEYS[1], ARGV[1])
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
for i = 3, #ARGV do redis.call('ZADD', KEYS[2], 'XX', due, ARGV[i]) end
return #ARGV - 2
"""

# KEYS: due, rows, the bulk queue's list.  ARGV: at most this many, due after (ms), the
# longest queue (messages) at which a sweep still sends.  Returns request_id, row pairs that
# are past due, with their due time moved on (so a second sweeper does not take them too).
# While the queue is longer than the limit the rows are most likely in it, behind the others:
# sending them again would only lengthen it.
CLAIM_LUA = """
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
"""

# KEYS: due.  ARGV: due after (ms), request_ids.  A task waiting out a retry (the database
# is down) still holds its rows: no sweep is to send them again meanwhile.
TOUCH_LUA = """
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', due, ARGV[i]) end
return #ARGV - 1
"""

# KEYS: due, rows.  ARGV: request_ids whose rows have committed.
WRITTEN_LUA = """
for i = 1, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return #ARGV
"""

# A row added but not queued within this long (after the batch window) was held by a process
# that died, or one cut off from Redis (its own resend and the sweep's then both land: one row).
UNQUEUED_GRACE_MS = 5_000
# A sweep sends at most this many rows per task (a batcher's own cap).
CLAIM_ROWS = 200
# The bulk queue's length (messages) above which a sweep waits: see CLAIM_LUA.
MAX_BACKLOG = 1_000
