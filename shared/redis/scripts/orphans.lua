-- orphans: finds a chat worker's running chats that no live gateway follows any more (every
-- gateway in the chat's followers set silent longer than the limit, by Redis's clock) and
-- frees their stream slots. A chat with no followers set is left alone. Run by
-- workers/chat/orphans.py once a second.
--
-- KEYS[1]       the gateways set (zset: gateway name -> last beat, ms)
-- KEYS[2i-2]    for the i-th chat (i = 2 .. #ARGV): its followers set
-- KEYS[2i-1]    for the i-th chat: its key's streams set
-- ARGV[1]       silence (ms) after which a gateway is dead
-- ARGV[2..n]    the chats' job ids
-- Returns the job ids no live gateway follows (their stream slots freed).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive_after = now - tonumber(ARGV[1])
local orphans = {}
for i = 2, #ARGV do
  local members = redis.call('SMEMBERS', KEYS[2 * i - 2])
  if #members > 0 then
    local alive = false
    for _, member in ipairs(members) do
      local beat = redis.call('ZSCORE', KEYS[1], member)
      if beat and tonumber(beat) >= alive_after then
        alive = true
        break
      end
    end
    if not alive then
      redis.call('ZREM', KEYS[2 * i - 1], ARGV[i])
      orphans[#orphans + 1] = ARGV[i]
    end
  end
end
return orphans
