-- Take an activity out of service while its state is rebuilt from MySQL: until ARGV[1] (or
-- until install.lua rewrites the state, whichever comes first) every grab answers 'contended'
-- (retry). Grabs that won before are still writing MySQL; the rebuild waits for them.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed (layout: install.lua)
-- ARGV[1] fenced_until_ms (a rebuild that dies leaves no activity out of service for good)
-- Returns the user ids holding a mark, or nil when there is no state.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return nil
end
redis.call('HSET', KEYS[1], 'fenced_until_ms', ARGV[1])
return redis.call('HKEYS', KEYS[3])
