-- redis_queue_async: grabs whose MySQL transaction committed (or that went to the dead letters)
-- leave the persist stream: acknowledged to the consumer group and deleted, in one step, so the
-- stream's length is always the number of grabs still on their way to MySQL.
-- An empty stream expires with the activity's other keys; it never does while it holds a grab.
--
-- KEYS[1] meta (layout: install.lua), KEYS[2] persist stream
-- ARGV[1] consumer group, ARGV[2 ..] entry ids (at most a few thousand: unpack's stack)
-- Returns the number of entries left in the stream.

redis.call('XACK', KEYS[2], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[2], unpack(ARGV, 2))
local left = redis.call('XLEN', KEYS[2])
if left == 0 then
  local deadline = redis.call('HGET', KEYS[1], 'deadline_ms')
  if deadline then
    redis.call('PEXPIREAT', KEYS[2], deadline)
  else
    redis.call('DEL', KEYS[2]) -- the state expired: no grab can come any more
  end
end
return left
