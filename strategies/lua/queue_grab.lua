-- redis_queue: one grab in one round trip (seeds 001 and 002): closed or expired?, already
-- grabbed?, pop a pre-split packet, record user -> packet. Nothing can run in between.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- ARGV[1] user_id, ARGV[2] now_ms (the web server's clock, the one expires_at was set by)
-- Returns {outcome, mark, epoch}; outcome is
--   'grabbed'          mark = "cents:packet_id" just popped and recorded for the user
--   'already_grabbed'  mark = what the user holds
--   'sold_out', 'closed'
--   'missing'          no state: Redis lost it, or it expired after the activity did

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'epoch', 'deadline_ms')
if not meta[1] then
  return {'missing'}
end
if meta[1] ~= 'open' or tonumber(ARGV[2]) >= tonumber(meta[2]) then
  return {'closed'}
end
local mark = redis.call('HGET', KEYS[3], ARGV[1])
if mark then
  return {'already_grabbed', mark, meta[3]}
end
local packet = redis.call('LPOP', KEYS[4])
if not packet then
  return {'sold_out'}
end
redis.call('HSET', KEYS[3], ARGV[1], packet)
redis.call('PEXPIREAT', KEYS[3], meta[4])
redis.call('DECR', KEYS[2])
redis.call('HINCRBY', KEYS[1], 'remaining_cents', -tonumber(string.match(packet, '^%d+')))
return {'grabbed', packet, meta[3]}
