-- The grabs of many users in one round trip, for every Redis strategy (a batch of one is a
-- single grab). For each user, in order: closed or expired?, already grabbed?, a packet left?,
-- then take one, by `pop` (a pre-split packet from the list: redis_queue, redis_queue_async;
-- seeds 001 and 002) or by `draw` (the amount drawn from what is left by the activity's
-- allocation, on integer cents: redis_counter, seed 000 done right), and record user -> mark.
-- Winning and "how much" happen in the same atomic step. Every check and draw is made before the
-- first write, so an error (a corrupt state) leaves nothing half done (but a throttle count:
-- the request was made, as when the checks ran on their own).
-- redis_queue_async passes a fifth key: each grab is also appended to its persist stream, in the
-- same atomic step, and that is what makes the answer durable before MySQL has it.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- KEYS[5] (redis_queue_async) persist stream: entry {user, mark}; it loses any expiry while it
--         holds grabs (lua/persisted.lua gives it back the activity's deadline once empty)
-- ARGV[1] now_ms (the web server's clock, the one expires_at was set by)
-- ARGV[2] 'pop' or 'draw'
-- ARGV[3] draw: the seed for math.random (< 2^31, fresh per call: Redis 7 seeds the scripts'
--         generator with a constant at start-up, so without it every restart would replay the
--         same amounts, on every node alike); pop: unused
-- then per user a triple: user_id, attempt (a token fresh per grab call, kept beside the mark as
--         "mark|attempt": a re-run of the same attempt after a lost reply gets the same grab
--         and takes nothing more), checks: '' for none, else the web request's own checks
--         (lua/checks.lua `checked`), made here so that the request sends Redis nothing else
--         (redpack/api/gate.py); a re-run checks, and counts, a member that did not win again,
--         so it may be refused this time. The same user twice: the second finds the first
--         one's mark.
-- Returns {epoch, then per user: outcome, mark, holder}; outcome is
--   'disabled'         the user is in the bans set: nothing taken, nothing counted
--   'throttled'        mark = the window's count with this request, over the limit: nothing taken
--   'grabbed'          mark = what this attempt took: "cents:packet_id" popped, or "cents" drawn
--   'already_grabbed'  mark = what the user holds, holder = the attempt that took it ('' after
--                      a rebuild from MySQL)
--   'sold_out', 'closed', 'contended' (being rebuilt: fence.lua)
--   'missing'          no state: Redis lost it, or it expired after the activity did (epoch '')

-- Integer cents in Lua's doubles: exact below 2^53; the quotients below stay far from that.
local function draw(allocation, remaining, count)
  if count == 1 then
    return remaining -- the last packet takes the rest
  end
  local ceiling = remaining - (count - 1) -- leave one cent for every packet still to come
  if allocation == 'double_average' then
    return math.random(1, math.max(1, math.min(math.floor(2 * remaining / count), ceiling)))
  elseif allocation == 'line_segment' then
    -- The first segment of a random cut of [0, remaining] into `count` parts: the smallest of
    -- k = count-1 distinct cut points among n = remaining-1. Whichever is shorter: walk up from
    -- 1 (given no cut below m, m is a cut with probability k / (n - m + 1); about n / (k + 1)
    -- steps), or sample the k points by Floyd's algorithm (k steps).
    local n, k = remaining - 1, count - 1
    if n / (k + 1) < k then
      local m = 1
      while math.random() * (n - m + 1) >= k do
        m = m + 1
      end
      return m
    end
    local points, smallest = {}, remaining
    for j = remaining - count + 1, remaining - 1 do
      local cut = math.random(1, j)
      if points[cut] then
        cut = j
      end
      points[cut] = true
      smallest = math.min(smallest, cut)
    end
    return smallest
  elseif allocation == 'equal' then
    return math.floor((remaining + count - 1) / count) -- ceiling division spreads the cents
  end
  return redis.error_reply('unknown allocation ' .. tostring(allocation))
end

-- include: checks.lua

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'epoch', 'deadline_ms',
  'allocation', 'remaining_cents', 'fenced_until_ms')
local out = {meta[3] or ''}
local now = tonumber(ARGV[1])
local popping = ARGV[2] == 'pop'
local refused
if not meta[1] then
  refused = 'missing'
elseif meta[7] and now < tonumber(meta[7]) then
  refused = 'contended' -- being rebuilt (fence.lua)
elseif meta[1] ~= 'open' or now >= tonumber(meta[2]) then
  refused = 'closed'
end
local left, remaining, packets = 0, 0, {}
if refused then
  -- every user is answered below without taking anything
elseif popping then
  -- The packets this batch can pop at most, read now, taken (LTRIM) once all is decided.
  packets = redis.call('LRANGE', KEYS[4], 0, (#ARGV - 3) / 3 - 1)
  left = #packets
else
  left = tonumber(redis.call('GET', KEYS[2]) or '0')
  remaining = tonumber(meta[6])
  if remaining < left then
    return redis.error_reply('remaining cents below remaining count: state is corrupt')
  end
  math.randomseed(tonumber(ARGV[3]))
end

local marks = {} -- user -> {mark, holder}, including this batch's own grabs
local grabs = {} -- {user, attempt, mark} in order
local taken = 0 -- cents
for i = 4, #ARGV, 3 do
  local user, attempt, checks = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local held = marks[user]
  if not held and meta[1] then
    local value = redis.call('HGET', KEYS[3], user)
    if value then
      local mark, holder = string.match(value, '^([^|]*)|?(.*)$')
      held = {mark, holder}
      marks[user] = held
    end
  end
  local stopped = nil
  if checks ~= '' and not (held and held[2] == attempt) then
    stopped = checked(user, checks)
    if type(stopped) == 'table' then
      return stopped -- the error reply of checked()
    end
  end
  if held and held[2] == attempt then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'grabbed', held[1], held[2] -- a re-run
  elseif stopped == 'disabled' then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'disabled', '', ''
  elseif stopped then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'throttled', stopped, ''
  elseif refused then
    out[#out + 1], out[#out + 2], out[#out + 3] = refused, '', ''
  elseif held then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'already_grabbed', held[1], held[2]
  elseif #grabs >= left then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'sold_out', '', '' -- the counter's guard
  else
    local mark = packets[#grabs + 1]
    if not popping then
      local cents = draw(meta[5], remaining, left - #grabs)
      if type(cents) == 'table' then
        return cents -- the error reply of draw(); nothing is written yet
      end
      remaining = remaining - cents
      mark = tostring(cents)
    end
    taken = taken + tonumber(string.match(mark, '^%d+'))
    grabs[#grabs + 1] = {user, attempt, mark}
    marks[user] = {mark, attempt}
    out[#out + 1], out[#out + 2], out[#out + 3] = 'grabbed', mark, attempt
  end
end

if #grabs > 0 then
  if popping then
    redis.call('LTRIM', KEYS[4], #grabs, -1)
  end
  for _, grab in ipairs(grabs) do
    redis.call('HSET', KEYS[3], grab[1], grab[3] .. '|' .. grab[2])
    if KEYS[5] then
      redis.call('XADD', KEYS[5], '*', 'user', grab[1], 'mark', grab[3])
    end
  end
  redis.call('PEXPIREAT', KEYS[3], meta[4])
  redis.call('DECRBY', KEYS[2], #grabs)
  redis.call('HINCRBY', KEYS[1], 'remaining_cents', -taken)
  if KEYS[5] then
    redis.call('PERSIST', KEYS[5])
  end
end
return out
