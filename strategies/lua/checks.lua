-- A web request's checks (redpack/api/gate.py), included by the scripts that make them
-- (strategies/lua/__init__.py `source`): the gate's own script, the grab script of the Redis
-- strategies and the batch checks of group_commit.

-- One request counted in a throttle window: its count, this request included; the window
-- expires `expiry` seconds after its first request.
local function counted(window, expiry)
  local count = redis.call('INCR', window)
  redis.call('EXPIRE', window, expiry, 'NX')
  return count
end

-- `checks` as strategies/request_checks.py `checks_arg` writes them:
-- "<bans set> <throttle window key or -> <limit> <window expiry s>". Returns 'disabled' (the
-- user is in the set: nothing counted), the window's count as text when this request is over
-- the limit, or nil: go on.
local function checked(user, checks)
  local bans, window, limit, expiry = string.match(checks, '^(%S+) (%S+) (%d+) (%d+)$')
  if not bans then
    return redis.error_reply('malformed checks ' .. checks)
  end
  if redis.call('SISMEMBER', bans, user) == 1 then
    return 'disabled'
  end
  if window ~= '-' then
    local count = counted(window, expiry)
    if count > tonumber(limit) then
      return tostring(count)
    end
  end
  return nil
end
