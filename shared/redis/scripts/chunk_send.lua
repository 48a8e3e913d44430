-- chunk_send: one chunk of a job: PUBLISH on its channel (the live path) and XADD to its capped
-- replay stream (and EXPIRE the stream the first time), as one command and one reply per
-- chunk, pipelined on the process's Redis pipe. Run by workers/chat/publish.py.
--
-- KEYS[1]  the job's channel
-- KEYS[2]  the job's replay stream
-- KEYS[3]  optional: the job's cancel flag (given with the `started` chunk)
-- ARGV[1]  the message
-- ARGV[2]  the replay stream's approximate maxlen
-- ARGV[3]  the replay stream's ttl, s ('0': leave its expiry as it is)
-- Returns 1 if the cancel flag is set (or no flag was given), else 0.

redis.call('PUBLISH', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'm', ARGV[1])
if ARGV[3] ~= '0' then redis.call('EXPIRE', KEYS[2], ARGV[3]) end
if KEYS[3] then return redis.call('EXISTS', KEYS[3]) end
return 1
