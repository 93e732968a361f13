-- redis_queue: one grab in one round trip (seeds 001 and 002): closed or expired?, already
-- grabbed?, pop a pre-split packet, record user -> packet. Nothing can run in between.
-- redis_queue_async passes a fifth key: the grab is also appended to its persist stream, in the
-- same atomic step, and that is what makes the answer durable before MySQL has it.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- KEYS[5] (redis_queue_async) persist stream: entry {user, mark}; it loses any expiry while it
--         holds grabs (lua/persisted.lua gives it back the activity's deadline once empty)
-- ARGV[1] user_id, ARGV[2] now_ms (the web server's clock, the one expires_at was set by),
-- ARGV[3] attempt (a token fresh per grab call, kept beside the mark as "mark|attempt": a re-run
--         of the same attempt after a lost reply gets the same answer and appends nothing)
-- Returns {outcome, mark, epoch[, holder]}; outcome is
--   'grabbed'          mark = "cents:packet_id" popped and recorded for the user by this attempt
--   'already_grabbed'  mark = what the user holds, holder = the attempt that popped it ('' after
--                      a rebuild from MySQL)
--   'sold_out', 'closed', 'contended' (being rebuilt: fence.lua)
--   'missing'          no state: Redis lost it, or it expired after the activity did

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'epoch', 'deadline_ms',
  'fenced_until_ms')
if not meta[1] then
  return {'missing'}
end
local held = redis.call('HGET', KEYS[3], ARGV[1])
local mark, holder
if held then
  mark, holder = string.match(held, '^([^|]*)|?(.*)$')
  if holder == ARGV[3] then
    return {'grabbed', mark, meta[3]} -- this attempt ran before and its reply was lost
  end
end
if meta[5] and tonumber(ARGV[2]) < tonumber(meta[5]) then
  return {'contended'} -- being rebuilt (fence.lua)
end
if meta[1] ~= 'open' or tonumber(ARGV[2]) >= tonumber(meta[2]) then
  return {'closed'}
end
if held then
  return {'already_grabbed', mark, meta[3], holder}
end
local packet = redis.call('LPOP', KEYS[4])
if not packet then
  return {'sold_out'}
end
redis.call('HSET', KEYS[3], ARGV[1], packet .. '|' .. ARGV[3])
redis.call('PEXPIREAT', KEYS[3], meta[4])
redis.call('DECR', KEYS[2])
redis.call('HINCRBY', KEYS[1], 'remaining_cents', -tonumber(string.match(packet, '^%d+')))
if KEYS[5] then
  redis.call('XADD', KEYS[5], '*', 'user', ARGV[1], 'mark', packet)
  redis.call('PERSIST', KEYS[5])
end
return {'grabbed', packet, meta[3]}
