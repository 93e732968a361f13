-- Close an activity: from now on every grab answers 'closed'. Idempotent.
-- The state is kept a grace period after the close (or after expiry, if that comes first).
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- ARGV[1] now_ms, ARGV[2] grace_ms
-- Returns {remaining count, remaining cents} as Redis holds them at the close,
-- or nil when there is no state (lost or expired): then MySQL alone knows what is left.

local meta = redis.call('HMGET', KEYS[1], 'deadline_ms', 'remaining_cents')
if not meta[1] then
  return nil
end
redis.call('HSET', KEYS[1], 'status', 'closed')
local deadline = tonumber(ARGV[1]) + tonumber(ARGV[2])
if deadline < tonumber(meta[1]) then
  redis.call('HSET', KEYS[1], 'deadline_ms', deadline)
  for _, key in ipairs(KEYS) do
    redis.call('PEXPIREAT', key, deadline)
  end
end
return {tonumber(redis.call('GET', KEYS[2])), tonumber(meta[2])}
