-- chunk_send: chunks of jobs, each PUBLISHed on its job's channel (the live path) and XADDed to
-- its capped replay stream (which it EXPIREs the first time), in the order given, as one
-- command and one reply, pipelined on the process's Redis pipe. Run by workers/chat/publish.py:
-- one chunk a run, and the runs queued back to back merged into one (shared/redis/pipe.py).
--
-- KEYS[1..2n]    per chunk i (of n): KEYS[2i-1] its job's channel, KEYS[2i] its job's replay
--                stream
-- KEYS[2n+1]     optional, with a lone chunk: its job's cancel flag (given with `started`)
-- ARGV[1..3n]    per chunk i: ARGV[3i-2] the message, ARGV[3i-1] the replay stream's
--                approximate maxlen, ARGV[3i] its ttl, s ('0': leave its expiry as it is)
-- Returns 1 if the cancel flag is set (or no flag was given), else 0.

local chunks = #ARGV / 3
for i = 0, chunks - 1 do
  local stream, message, ttl = KEYS[2 * i + 2], ARGV[3 * i + 1], ARGV[3 * i + 3]
  redis.call('PUBLISH', KEYS[2 * i + 1], message)
  redis.call('XADD', stream, 'MAXLEN', '~', ARGV[3 * i + 2], '*', 'm', message)
  if ttl ~= '0' then redis.call('EXPIRE', stream, ttl) end
end
local flag = KEYS[2 * chunks + 1]
if flag then return redis.call('EXISTS', flag) end
return 1
