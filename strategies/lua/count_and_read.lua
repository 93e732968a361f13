-- The gate's one round trip (redpack/ratelimit.py `count_and_read`): count a request in its
-- throttle window, look for a member in a set, read a key with its PTTL.
-- KEYS: the window's key, the set, the key to read, each only when its ARGV is not empty.
-- ARGV: the window's expiry in seconds, the member to look for, anything to read the key.

-- include: checks.lua

local at, count, member, value, ttl = 1, false, false, false, false
if ARGV[1] ~= '' then
  count = counted(KEYS[at], ARGV[1])
  at = at + 1
end
if ARGV[2] ~= '' then
  member = redis.call('SISMEMBER', KEYS[at], ARGV[2])
  at = at + 1
end
if ARGV[3] ~= '' then
  value = redis.call('GET', KEYS[at])
  ttl = redis.call('PTTL', KEYS[at])
end
return {count, member, value, ttl}
