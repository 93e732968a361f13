-- redis_counter (seed 000, done right, batched): the grabs of many users in one round trip. For
-- each user, in order: closed or expired?, already grabbed?, a packet left?, draw the amount from
-- what is left, record user -> amount, decrement. Winning and "how much" happen in the same
-- atomic step. A batch of one is a single grab.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed (layout: install.lua)
-- ARGV[1] now_ms, ARGV[2] seed for math.random (< 2^31, fresh per call: Redis 7 seeds the
--         scripts' generator with a constant at start-up, so without it every restart would
--         replay the same amounts, on every node alike), then per user a pair
-- ARGV[2i+1] user_id, ARGV[2i+2] attempt (a token fresh per grab call, kept beside the mark as
--         "mark|attempt": a re-run of the same attempt after a lost reply gets the same answer,
--         never a second amount and never `already_grabbed`)
-- Returns {epoch, then per user: outcome, mark, holder}; outcome is 'grabbed' (mark = "cents"
-- drawn by this attempt), 'already_grabbed' (mark = what the user holds, holder = the attempt
-- that drew it, '' after a rebuild from MySQL), 'sold_out', 'closed', 'contended' (being
-- rebuilt), 'missing' (no state). Every check and draw is made before the first write, so an
-- error (a corrupt state) leaves nothing half done.

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

local meta = redis.call('HMGET', KEYS[1], 'status', 'expires_ms', 'epoch', 'deadline_ms',
  'allocation', 'remaining_cents', 'fenced_until_ms')
local out = {meta[3] or ''}
local now = tonumber(ARGV[1])
local refused
if not meta[1] then
  refused = 'missing'
elseif meta[7] and now < tonumber(meta[7]) then
  refused = 'contended' -- being rebuilt (fence.lua)
elseif meta[1] ~= 'open' or now >= tonumber(meta[2]) then
  refused = 'closed'
end
local count, remaining = 0, 0
if not refused then
  count = tonumber(redis.call('GET', KEYS[2]) or '0')
  remaining = tonumber(meta[6])
  if remaining < count then
    return redis.error_reply('remaining cents below remaining count: state is corrupt')
  end
  math.randomseed(tonumber(ARGV[2]))
end

local marks = {} -- user -> {mark, holder}, including this batch's own grabs
local grabs = {} -- {user, attempt, cents} in order
local taken = 0
for i = 3, #ARGV, 2 do
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
  elseif count <= 0 then
    out[#out + 1], out[#out + 2], out[#out + 3] = 'sold_out', '', '' -- the counter's guard
  else
    local cents = draw(meta[5], remaining, count)
    if type(cents) == 'table' then
      return cents -- the error reply of draw(); nothing is written yet
    end
    count, remaining, taken = count - 1, remaining - cents, taken + cents
    grabs[#grabs + 1] = {user, attempt, cents}
    marks[user] = {tostring(cents), attempt}
    out[#out + 1], out[#out + 2], out[#out + 3] = 'grabbed', tostring(cents), attempt
  end
end

if #grabs > 0 then
  for _, grab in ipairs(grabs) do
    redis.call('HSET', KEYS[3], grab[1], grab[3] .. '|' .. grab[2])
  end
  redis.call('PEXPIREAT', KEYS[3], meta[4])
  redis.call('DECRBY', KEYS[2], #grabs)
  redis.call('HINCRBY', KEYS[1], 'remaining_cents', -taken)
end
return out
