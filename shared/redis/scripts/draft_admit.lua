-- draft_admit: admits a `draft` frame's prefill in one round trip: the load checks (a chat is
-- queued, the draft list is full), the key's draft budget, the coalescing (the conversation's
-- newest draft), the abort of an older prefill in flight (its job id on the cancel channel),
-- and the enqueue. Run by gateway/drafts.py; shared/drafts.py says why drafts never delay a
-- chat.
--
-- KEYS[1]  the chat queue's priority-0 list
-- KEYS[2]  the draft list
-- KEYS[3]  the key's draft rate counter
-- KEYS[4]  the conversation's latest-draft key
-- KEYS[5]  the conversation's running-draft key
-- ARGV[1]  the draft's job id
-- ARGV[2]  its task message
-- ARGV[3]  the rate limit per window
-- ARGV[4]  the window, ms
-- ARGV[5]  the latest-draft key's ttl, s
-- ARGV[6]  the cancel channel
-- ARGV[7]  the draft list's cap
-- Returns 'queued', 'busy' (a chat waits), 'full' (the draft list) or 'rate' (over budget).

if redis.call('LLEN', KEYS[1]) > 0 then return 'busy' end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[7]) then return 'full' end
local n = redis.call('INCR', KEYS[3])
if n == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
if n > tonumber(ARGV[3]) then return 'rate' end
redis.call('SET', KEYS[4], ARGV[1], 'EX', ARGV[5])
local running = redis.call('GET', KEYS[5])
if running and running ~= ARGV[1] then redis.call('PUBLISH', ARGV[6], running) end
redis.call('LPUSH', KEYS[2], ARGV[2])
return 'queued'
