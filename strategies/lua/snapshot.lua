-- Read one activity's whole state in one atomic step, for the auditor.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed, KEYS[4] packets (layout: install.lua)
-- Returns {meta as HGETALL, count or nil, grabbed as HGETALL, packets as LRANGE,
--          {PTTL of each key: -2 missing, -1 no expiry}}

local ttls = {}
for i, key in ipairs(KEYS) do
  ttls[i] = redis.call('PTTL', key)
end
return {
  redis.call('HGETALL', KEYS[1]),
  redis.call('GET', KEYS[2]),
  redis.call('HGETALL', KEYS[3]),
  redis.call('LRANGE', KEYS[4], 0, -1),
  ttls,
}
