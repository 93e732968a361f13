-- redis_queue (seeds 001 and 002, batched): the grabs of many users in one round trip. For each
-- user, in order: closed or expired?, already grabbed?, pop a pre-split packet, record
-- user -> packet. Nothing can run in between. A batch of one is the seeds' single grab.
-- redis_queue_async passes a fifth key: each grab is also appended to its persist stream, in the
-- same atomic step, and that is what makes the answer durable before MySQL has it.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- KEYS[5] (redis_queue_async) persist stream: entry {user, mark}; it loses any expiry while it
--         holds grabs (lua/persisted.lua gives it back the activity's deadline once empty)
-- ARGV[1] now_ms (the web server's clock, the one expires_at was set by), then per user a pair
-- ARGV[2i] user_id, ARGV[2i+1] attempt (a token fresh per grab call, kept beside the mark as
--         "mark|attempt": a re-run of the same attempt after a lost reply gets the same answer
--         and appends nothing). The same user twice: the second finds the first one's mark.
-- Returns {epoch, then per user: outcome, mark, holder}; outcome is
--   'grabbed'          mark = "cents:packet_id" popped and recorded for the user by this attempt
--   'already_grabbed'  mark = what the user holds, holder = the attempt that popped it ('' after
--                      a rebuild from MySQL)
--   'sold_out', 'closed', 'contended' (being rebuilt: fence.lua)
--   'missing'          no state: Redis lost it, or it expired after the activity did (epoch '')
-- Every check is made before the first write, so an error leaves nothing half done.

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'epoch', 'deadline_ms',
  'fenced_until_ms')
local out = {meta[3] or ''}
local now = tonumber(ARGV[1])
local refused
if not meta[1] then
  refused = 'missing'
elseif meta[5] and now < tonumber(meta[5]) then
  refused = 'contended' -- being rebuilt (fence.lua)
elseif meta[1] ~= 'open' or now >= tonumber(meta[2]) then
  refused = 'closed'
end

local marks = {} -- user -> {mark, holder}, including this batch's own grabs
local grabs = {} -- {user, attempt, packet} in order
-- The packets this batch can pop at most, read now, taken (LTRIM) once everything is decided.
local packets = not refused and redis.call('LRANGE', KEYS[4], 0, (#ARGV - 1) / 2 - 1) or {}
for i = 2, #ARGV, 2 do
  local user, attempt = ARGV[i], ARGV[i + 1]
  local held = marks[user]
  if not held and meta[1] then
    local value = redis.call('HGET', KEYS[3], user)
    if value then
      local mark, holder = string.match(value, '^([^|]*)|?(.*)$')
      held = {mark, holder}
      marks[user] = held
    end
  end
  if held and held[2] == attempt then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'grabbed', held[1], held[2] -- a re-run
  elseif refused then
    out[#out + 1], out[#out + 2], out[#out + 3] = refused, '', ''
  elseif held then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'already_grabbed', held[1], held[2]
  elseif #grabs >= #packets then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'sold_out', '', ''
  else
    local packet = packets[#grabs + 1]
    grabs[#grabs + 1] = {user, attempt, packet}
    marks[user] = {packet, attempt}
    out[#out + 1], out[#out + 2], out[#out + 3] = 'grabbed', packet, attempt
  end
end

if #grabs > 0 then
  local cents = 0
  redis.call('LTRIM', KEYS[4], #grabs, -1)
  for _, grab in ipairs(grabs) do
    redis.call('HSET', KEYS[3], grab[1], grab[3] .. '|' .. grab[2])
    cents = cents + tonumber(string.match(grab[3], '^%d+'))
    if KEYS[5] then
      redis.call('XADD', KEYS[5], '*', 'user', grab[1], 'mark', grab[3])
    end
  end
  redis.call('PEXPIREAT', KEYS[3], meta[4])
  redis.call('DECRBY', KEYS[2], #grabs)
  redis.call('HINCRBY', KEYS[1], 'remaining_cents', -cents)
  if KEYS[5] then
    redis.call('PERSIST', KEYS[5])
  end
end
return out
