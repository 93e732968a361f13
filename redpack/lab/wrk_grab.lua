-- wrk script of `manage.py compare`'s HTTP runs from wrk (redpack/lab/wrk.py): every request
-- POSTs a grab (or GETs the ping, WRK_METHOD) as the next user, and every answer is counted
-- by its status and outcome.
--
-- Environment:
--   WRK_TOKENS    file of Authorization header values, one line per user
--   WRK_PATH      the grab path, /api/activities/<id>/grab/
--   WRK_METHOD    POST (a grab, the default) or GET (the ping: the burst's web ceiling)
--   WRK_THREADS   wrk's -t: thread k of n takes the users k, k + n, k + 2n, ...
--   WRK_ONCE      "1": each user grabs once (the hot burst): a thread that has sent one request
--                 per user of its share sends no more, and once all of them are answered it
--                 writes WRK_DONE_DIR/<k> and stops. Else the users are taken round and round.
--   WRK_DONE_DIR  see WRK_ONCE
--
-- A connection that breaks before its answer comes is opened again by wrk, which then asks
-- request() for a new request without delay(). In a burst that would be the next user, past
-- the thread's share round again to its first users: a second grab by a user (already_grabbed,
-- counted as an answer) in place of the lost one, whose user would never hear back while the
-- burst looked answered in full. So in a burst a request() that no delay() let through sends
-- GET /healthz instead ("resent": counted apart, never as an answer), and the lost request
-- stays unanswered.
--
-- done() prints one line, "WRK_RESULT <json>": the users' requests sent ("made"; in a timed
-- run, those without an answer were cut off by its stop or lost with a broken connection),
-- answers by "status|outcome|reason|error code",
-- the amounts of the `grabbed` answers, wrk's error counts, the latency percentiles and, for
-- each bound of WRK_BOUNDS_MS, how many answers came within it (wrk's own record of latency,
-- from the request's write to its response; a request past --timeout is not in it).

local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  local step = tonumber(os.getenv("WRK_THREADS"))
  tokens = {}
  local line_no = 0
  for line in io.lines(os.getenv("WRK_TOKENS")) do
    if line_no % step == id then
      tokens[#tokens + 1] = line
    end
    line_no = line_no + 1
  end
  path = os.getenv("WRK_PATH")
  method = os.getenv("WRK_METHOD") or "POST"
  once = os.getenv("WRK_ONCE") == "1"
  done_dir = os.getenv("WRK_DONE_DIR")
  -- ready: requests that delay() let through and request() has not made yet (each connection's
  -- delay() is followed by its request(), with other connections' calls in between).
  -- made: the requests of users this thread sent (not the check, not a resent /healthz).
  next_user, sent, answered, resent, ready, made = 1, 0, 0, 0, 0, 0
  answers, granted = {}, {}
end

-- Called before every request. Once a thread has sent its share, its connections idle (an hour's
-- delay) until it stops: a request cannot be withdrawn once request() is asked for it.
function delay()
  if once and sent >= #tokens then
    return 3600000
  end
  sent = sent + 1
  ready = ready + 1
  return 0
end

function request()
  if sent == 0 and ready == 0 then
    -- wrk's check of the script (on thread 0's state, before any request): never sent.
    return wrk.format(method, path, {["Authorization"] = tokens[1], ["Content-Length"] = "0"})
  end
  if once and ready == 0 then
    resent = resent + 1
    return wrk.format("GET", "/healthz")
  end
  ready = ready - 1
  made = made + 1
  local index = next_user
  next_user = next_user % #tokens + 1
  return wrk.format(method, path, {
    ["Authorization"] = tokens[index],
    ["Content-Length"] = "0",
  })
end

local function field(body, name)
  return body:match('"' .. name .. '"%s*:%s*"([%w_.]+)"') or ""
end

function response(status, headers, body)
  if body:match('^%s*{%s*"status"') then
    return -- /healthz: the answer to a request sent again (see above), not a user's
  end
  local outcome = field(body, "outcome")
  local key = status .. "|" .. outcome .. "|" .. field(body, "reason") .. "|" .. field(body, "code")
  answers[key] = (answers[key] or 0) + 1
  if outcome == "grabbed" then
    granted[#granted + 1] = field(body, "amount")
  end
  answered = answered + 1
  if once and answered == #tokens then
    local marker = io.open(done_dir .. "/" .. id, "w")
    marker:close()
    wrk.thread:stop()
  end
end

local function json_string(text)
  return '"' .. tostring(text):gsub('[%c"\\]', "") .. '"'
end

-- How many latencies are at most `bound` microseconds: wrk's record is a count per microsecond
-- that a Lua script can read only through percentiles, so the share is found by bisection.
local function at_most(latency, count, bound)
  if count == 0 or latency.min > bound then
    return 0
  end
  if latency.max <= bound then
    return count
  end
  local low, high = 0, 100
  for _ = 1, 24 do
    local middle = (low + high) / 2
    if latency:percentile(middle) <= bound then low = middle else high = middle end
  end
  return math.floor(low / 100 * count + 0.5)
end

function done(summary, latency, requests)
  local all_answers, all_granted, all_resent, all_made = {}, {}, 0, 0
  for _, thread in ipairs(threads) do
    all_resent = all_resent + (thread:get("resent") or 0)
    all_made = all_made + (thread:get("made") or 0)
    for key, count in pairs(thread:get("answers") or {}) do
      all_answers[key] = (all_answers[key] or 0) + count
    end
    for _, amount in ipairs(thread:get("granted") or {}) do
      all_granted[#all_granted + 1] = json_string(amount)
    end
  end
  local parts = {}
  for key, count in pairs(all_answers) do
    parts[#parts + 1] = json_string(key) .. ":" .. count
  end
  local count = summary.requests - summary.errors.timeout
  local cumulative = {}
  for bound in string.gmatch(os.getenv("WRK_BOUNDS_MS") or "", "%d+") do
    cumulative[#cumulative + 1] = json_string(bound) .. ":" .. at_most(latency, count, bound * 1000)
  end
  local percentiles = {}
  for _, q in ipairs({50, 95, 99}) do
    percentiles[#percentiles + 1] = '"' .. q .. '":' .. (count > 0 and latency:percentile(q) or 0)
  end
  local errors = summary.errors
  io.write("WRK_RESULT {",
    '"requests":', summary.requests, ",",
    '"duration_us":', summary.duration, ",",
    '"errors":{"connect":', errors.connect, ',"read":', errors.read, ',"write":', errors.write,
    ',"status":', errors.status, ',"timeout":', errors.timeout, "},",
    '"answers":{', table.concat(parts, ","), "},",
    '"resent":', all_resent, ",",
    '"made":', all_made, ",",
    '"granted":[', table.concat(all_granted, ","), "],",
    '"percentiles_us":{', table.concat(percentiles, ","), "},",
    '"max_us":', count > 0 and latency.max or 0, ",",
    '"at_most_ms":{', table.concat(cumulative, ","), "}}\n")
end
