-- gate-publish-v1.lua: publishes a bounded batch of due events of one gate, atomically.
--
-- Mirrors shared-contract's gate::GateState::publish_due (docs/event-gates.md). Finding an
-- event due and publishing it are one atomic step, so with several publishers (app
-- instances) each event is published by exactly one of them, and a publisher that dies
-- leaves nothing half done: the next call of any instance finds the rest still due.
--
-- KEYS: the eight keys of gate-submit-v1.lua, same order.
-- ARGV:
--   [1] mode                     "only_once" | "strictly_once"
--   [2] duration_ms              1..=2^40-1
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] max_batch                1..=100000: most events published by this call
--   [5] stream_max_len           1..=2^40-1
--   Arguments after [5] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, clock, published, retry_after_ms, next_due_ms}
--   PUBLISHED           `published` events with publish_at <= now went to published, in due
--                       order (publish_at, id), each with the next clock value and one stream
--                       entry; clock is the gate's clock after; next_due_ms is the earliest
--                       publish_at still incubating (0: none)
--   CLOCK_UNSAFE, CLOCK_EXHAUSTED, STATE_INCOMPATIBLE, INVALID: as gate-submit-v1.lua;
--                       nothing changed
--   Numbers are integers in 0..=2^53-1; fields that do not apply are 0.
--
-- State: see gate-submit-v1.lua.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local MAX = 9007199254740991
local argv = ARGV
local mode, a2, a3, a4, a5 = argv[1], argv[2], argv[3], argv[4], argv[5]
if #KEYS ~= 8 or not a5 or (mode ~= 'only_once' and mode ~= 'strictly_once')
  or a2 == '' or a3 == '' or a4 == '' or a5 == '' or string.find(a2 .. a3 .. a4 .. a5, '%D') then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local duration, max_regression, max_batch, max_len = a2 + 0, a3 + 0, a4 + 0, a5 + 0
if duration < 1 or duration > 1099511627775 or max_regression > 1099511627775 or max_batch < 1
  or max_batch > 100000 or max_len < 1 or max_len > 1099511627775 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
if now > 281474976710655 then
  return { 'CLOCK_UNSAFE', now, 0, 0, 0, 1000, 0 }
end
local function fmt(n) return string.format('%d', n) end

local meta = redis.pcall('HMGET', KEYS[2], 'mode', 'duration', 'now')
local raw_clock = redis.pcall('GET', KEYS[1])
if meta.err or (type(raw_clock) == 'table' and raw_clock.err) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
end
if (meta[1] and (meta[1] ~= mode or meta[2] ~= a2)) or (raw_clock and string.find(raw_clock, '%D')) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
end
local clock = raw_clock and tonumber(raw_clock) or 0
local last = meta[3] and tonumber(meta[3])
local eff = now
if last and now < last then
  if last - now > max_regression then
    return { 'CLOCK_UNSAFE', now, last, clock, 0, last - now, 0 }
  end
  eff = last
end

local due = redis.pcall('ZRANGEBYSCORE', KEYS[4], '-inf', fmt(eff), 'LIMIT', 0, max_batch)
if due.err then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
end
if clock + #due > MAX then
  return { 'CLOCK_EXHAUSTED', now, eff, clock, 0, 0, 0 }
end
-- Every record is checked before the first write.
local parsed = {}
for i = 1, #due do
  local r = redis.call('HGET', KEYS[3], due[i])
  local sub, pub, key
  if r then
    sub, pub, key = string.match(r, '^S:%d+:(%d+):(%d+)::(.*)$')
  end
  if not sub then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
  parsed[i] = { sub, pub, key }
end
if #due > 0 then
  local top = redis.pcall('XREVRANGE', KEYS[8], '+', '-', 'COUNT', 1)
  if top.err or (top[1] and tonumber(string.match(top[1][1], '^(%d+)')) > clock) then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
end
local c = clock
for i = 1, #due do
  local id, p = due[i], parsed[i]
  c = redis.call('INCR', KEYS[1])
  redis.call('HSET', KEYS[3], id, 'P:' .. fmt(c) .. ':' .. p[1] .. ':' .. p[2] .. ':' .. fmt(eff) .. ':' .. p[3])
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[5], fmt(eff), id)
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', a5, fmt(c) .. '-0', 's', 'P', 'i', id, 'k', p[3],
    'a', fmt(eff), 'p', p[2])
end
redis.call('HSET', KEYS[2], 'mode', mode, 'duration', a2, 'now', fmt(eff))
local next_due = 0
local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if first[2] then
  next_due = tonumber(first[2])
end
return { 'PUBLISHED', now, eff, c, #due, 0, next_due }
