-- response_move_head: moves a conversation's head (its newest stored response, for the
-- Responses door's previous_response_id) from one response to another, only if it is still
-- the first: two continuations of the same response race, and one of them wins. Run by
-- gateway/responses.py.
--
-- KEYS[1]  the conversation's head key
-- ARGV[1]  the response the head must still name
-- ARGV[2]  the new head's response id
-- ARGV[3]  the head's ttl, s
-- Returns 1 when the head moved, else 0.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
