-- draft_clear_running: clears a conversation's running-draft key, only if it still names this
-- draft (a newer one may be running there by now). Run by workers/chat/prefill.py.
--
-- KEYS[1]  the conversation's running-draft key
-- ARGV[1]  the draft's job id
-- Returns 1 when cleared, else 0.

if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
