-- queue_pop_more: pops up to ARGV[1] messages off the lists KEYS, in their order (kombu's
-- priority order), the way BRPOP takes one: from the right. One RPOP per message works on
-- every Redis version. Sent by workers/chat/consumer.py behind its BRPOP, in the same write.
--
-- KEYS[1..n]  the queue's lists, highest priority first
-- ARGV[1]     the most messages to pop
-- Returns the messages popped (possibly none).

local want, out = tonumber(ARGV[1]), {}
for _, key in ipairs(KEYS) do
  while #out < want do
    local message = redis.call('RPOP', key)
    if not message then break end
    out[#out + 1] = message
  end
end
return out
