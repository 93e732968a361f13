-- redis_counter: one grab once the user's lock is held (seed 000, done right): closed or
-- expired?, already grabbed?, a packet left?, draw the amount from what is left, record
-- user -> amount, decrement. Winning and "how much" happen in the same atomic step.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed (layout: install.lua)
-- ARGV[1] user_id, ARGV[2] now_ms, ARGV[3] attempt (a token fresh per grab call, kept beside the
--         mark as "mark|attempt": a re-run of the same attempt after a lost reply gets the same
--         answer, never a second amount and never `already_grabbed`),
-- ARGV[4] seed for math.random (< 2^31, fresh per call: Redis 7 seeds the scripts' generator
--         with a constant at start-up, so without it every restart would replay the same
--         amounts, on every node alike)
-- Returns {outcome, mark, epoch[, holder]}; outcome is 'grabbed' (mark = "cents" drawn by this
-- attempt), 'already_grabbed' (mark = what the user holds, holder = the attempt that drew it,
-- '' after a rebuild from MySQL), 'sold_out', 'closed', 'missing' (no state)

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
if meta[7] and tonumber(ARGV[2]) < tonumber(meta[7]) then
  return {'contended'} -- being rebuilt (fence.lua)
end
if meta[1] ~= 'open' or tonumber(ARGV[2]) >= tonumber(meta[2]) then
  return {'closed'}
end
if held then
  return {'already_grabbed', mark, meta[3], holder}
end
local count = tonumber(redis.call('GET', KEYS[2]) or '0')
if count <= 0 then
  return {'sold_out'} -- the guard: the counter never goes below zero
end
local remaining = tonumber(meta[6])
if remaining < count then
  return redis.error_reply('remaining cents below remaining count: state is corrupt')
end
math.randomseed(tonumber(ARGV[4]))
local cents = draw(meta[5], remaining, count)
if type(cents) == 'table' then
  return cents -- the error reply of draw()
end
redis.call('HSET', KEYS[3], ARGV[1], cents .. '|' .. ARGV[3])
redis.call('PEXPIREAT', KEYS[3], meta[4])
redis.call('DECR', KEYS[2])
redis.call('HINCRBY', KEYS[1], 'remaining_cents', -cents)
return {'grabbed', tostring(cents), meta[3]}
