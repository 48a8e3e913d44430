-- chat_requeue: queues a chat's task message again when a worker took it off the queue and
-- died before it started it: only where the message is no longer queued and the job's replay
-- stream holds nothing (no worker announced it), and only while the queue is short enough to
-- scan (LPOS is linear). Pushed at the end the workers read next. Run by gateway/requeue.py.
--
-- KEYS[1]  the chat queue's list
-- KEYS[2]  the job's replay stream
-- ARGV[1]  the task message
-- ARGV[2]  the longest queue scanned (a longer one most likely still holds the message)
-- Returns 1 when the message was queued again, else 0.

if redis.call('LLEN', KEYS[1]) > tonumber(ARGV[2]) then return 0 end
if redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
