-- Install one activity's Redis state, replacing whatever is there (on send, and redis_rebuild).
-- The caller reads MySQL, the source of truth, and passes all of it: one atomic step, so a grab
-- sees either the old state or the whole new one.
--
-- KEYS[1] meta     hash: epoch, status (open|closed), expires_ms, deadline_ms, allocation,
--                        remaining_cents; fenced_until_ms while rebuilt (fence.lua)
-- KEYS[2] count    string: packets remaining (the counter)
-- KEYS[3] grabbed  hash: user_id -> mark, "cents" or "cents:packet_id", then "|attempt" for a
--                  grab made in Redis (none for one rebuilt from MySQL)
-- KEYS[4] packets  list: "cents:packet_id" still to grab, popped from the head (redis_queue)
-- KEYS[5] persist  stream (redis_queue_async only): grabs not yet in MySQL. While it holds any,
--                  MySQL is not the whole truth: nothing is installed and 0 is returned. It is
--                  never deleted here (its consumer group lives on it).
-- ARGV[1] epoch (new random token), ARGV[2] status, ARGV[3] expires_ms, ARGV[4] deadline_ms
--         (every key expires then), ARGV[5] allocation, ARGV[6] remaining count,
--         ARGV[7] remaining cents, ARGV[8] G = number of grabbed users,
--         ARGV[9 .. 8+2G] user_id, mark pairs, ARGV[9+2G ..] the packets in pop order
-- Returns: 1, or 0 when refused (see KEYS[5])

local CHUNK = 1000 -- unpack() is bounded by the Lua C stack; an even size keeps HSET pairs whole

local function write_chunks(command, key, from, to)
  local i = from
  while i <= to do
    local last = math.min(i + CHUNK - 1, to)
    redis.call(command, key, unpack(ARGV, i, last))
    i = last + 1
  end
end

if KEYS[5] and redis.call('XLEN', KEYS[5]) > 0 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'status', ARGV[2], 'expires_ms', ARGV[3],
  'deadline_ms', ARGV[4], 'allocation', ARGV[5], 'remaining_cents', ARGV[7])
redis.call('SET', KEYS[2], ARGV[6])
local first_mark = 9
local first_packet = first_mark + 2 * tonumber(ARGV[8])
write_chunks('HSET', KEYS[3], first_mark, first_packet - 1)
write_chunks('RPUSH', KEYS[4], first_packet, #ARGV)
for _, key in ipairs(KEYS) do
  redis.call('PEXPIREAT', key, ARGV[4])
end
return 1
