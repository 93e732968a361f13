-- A representative one-round-trip grab (seed 002's shape), for the Redis ceiling of
-- `make compare` when a strategy names no script of its own (GrabStrategy.ceiling_script).
--
-- KEYS[1]  list of unclaimed packet amounts (cents)
-- KEYS[2]  hash user id -> amount: who grabbed what (the dedupe)
-- KEYS[3]  list of "user:amount" waiting to be written to MySQL
-- ARGV[1]  user id
-- Returns  the amount (> 0) grabbed; -1 already grabbed; 0 sold out.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return -1
end
local amount = redis.call('RPOP', KEYS[1])
if not amount then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], amount)
redis.call('LPUSH', KEYS[3], ARGV[1] .. ':' .. amount)
return tonumber(amount)
