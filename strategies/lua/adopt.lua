-- Take over a grab that an earlier attempt of the same user recorded in Redis but whose MySQL
-- write is not known to have happened (its reply was lost, or it answered outcome_unknown): the
-- mark now names this attempt, so the earlier one can no longer give it back (release.lua), and
-- this attempt writes the same row. UNIQUE (activity, user) lets only one of them land.
--
-- KEYS[1] meta, KEYS[2] count, KEYS[3] grabbed (layout: install.lua)
-- ARGV[1] user_id, ARGV[2] mark, ARGV[3] the attempt holding it ('' for a mark rebuilt from
--         MySQL), ARGV[4] this attempt
-- Returns 1 when taken over, 0 when the mark changed since.

local expected = ARGV[2]
if ARGV[3] ~= '' then
  expected = expected .. '|' .. ARGV[3]
end
if redis.call('HGET', KEYS[3], ARGV[1]) ~= expected then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. '|' .. ARGV[4])
return 1
