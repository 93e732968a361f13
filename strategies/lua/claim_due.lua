-- Claim up to ARGV[3] activities whose expiry is due, leasing each for ARGV[2] ms.
--
-- KEYS[1]  the expiry ZSET (member: activity id, score: expiry in epoch ms)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  lease, ms: a claimed activity becomes due again after it, unless its refund
--          committed and removed it (a worker that died mid-refund is retried, not lost)
-- ARGV[3]  batch size
-- Returns  the claimed activity ids
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, id in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, id)
end
return due
