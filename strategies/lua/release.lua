-- Undo one grab whose MySQL write failed, atomically, so nothing is lost and the user may retry:
-- the user's mark goes and (unless MySQL says the packet is already taken) the packet or the
-- amount goes back. Only if the state is the one the grab ran on (same epoch, same mark): after
-- a rebuild from MySQL, the new state already is right.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- ARGV[1] user_id, ARGV[2] mark the grab recorded, ARGV[3] epoch the grab saw,
-- ARGV[4] 'restore' (give back the amount, and the packet if the mark names one) or 'forget'
--         (only remove the mark: MySQL holds that packet as taken by someone else),
-- ARGV[5] the attempt that holds the mark: a later attempt of the same user that took the mark
--         over (adopt.lua) may be writing it to MySQL, so then nothing is given back
-- Returns 1 when released, 0 when the state changed since and nothing was done.

local meta = redis.call('HMGET', KEYS[1], 'epoch', 'deadline_ms')
if meta[1] ~= ARGV[3] or redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] .. '|' .. ARGV[5] then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == 'restore' then
  local cents, packet = string.match(ARGV[2], '^(%d+):?(%d*)$')
  redis.call('INCR', KEYS[2])
  redis.call('HINCRBY', KEYS[1], 'remaining_cents', cents)
  if packet ~= '' then
    redis.call('LPUSH', KEYS[4], ARGV[2])
    redis.call('PEXPIREAT', KEYS[4], meta[2])
  end
end
return 1
