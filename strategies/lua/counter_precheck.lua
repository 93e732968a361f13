-- redis_counter: the lock-free pre-check, read-only. It turns away the clicks that cannot win
-- (closed or expired, sold out) before any lock is taken; the others go on to the user's lock
-- and counter_grab.lua, which checks everything again. A user holding a grab goes on too: the
-- lock makes sure that grab's MySQL write is finished before `already_grabbed` is answered.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed (layout: install.lua)
-- ARGV[1] user_id, ARGV[2] now_ms
-- Returns 'closed', 'sold_out', 'contended' (being rebuilt), or 'go' (take the lock and grab; also when there is no state)

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'fenced_until_ms')
if not meta[1] then
  return 'go'
end
if meta[3] and tonumber(ARGV[2]) < tonumber(meta[3]) then
  return 'contended' -- being rebuilt (fence.lua)
end
if meta[1] ~= 'open' or tonumber(ARGV[2]) >= tonumber(meta[2]) then
  return 'closed'
end
local left = tonumber(redis.call('GET', KEYS[2]) or '0')
if left <= 0 and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  return 'sold_out'
end
return 'go'
