-- The checks of many web requests in one round trip (group_commit's batch, whose strategy
-- has no script of its own to make them in).
-- ARGV: per request a pair: user_id, checks (lua/checks.lua `checked`).
-- Returns per request: '' (go on), 'disabled', or the window's count when over its limit.

-- include: checks.lua

local out = {}
for i = 1, #ARGV, 2 do
  local stopped = checked(ARGV[i], ARGV[i + 1])
  if type(stopped) == 'table' then
    return stopped -- the error reply of checked()
  end
  out[#out + 1] = stopped or ''
end
return out
