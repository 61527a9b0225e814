-- gate-sweep-v1.lua: the conditional delete of one gate, atomically.
--
-- Mirrors shared-contract's gate::GateState::sweep (docs/event-gates.md): removes at most
-- max_batch terminal events that became terminal before cutoff = now - retention + 1 (so an
-- event terminal at t goes once now >= t + retention), oldest first, and prunes at most
-- max_batch lapsed key windows (end <= now). Incubating events are never removed, and no key
-- has a TTL: no event expires unhandled (the seed's reason not to use EXPIRE). Removal is no
-- status change: no clock value, no stream entry.
--
-- KEYS: the eight keys of gate-submit-v1.lua, same order.
-- ARGV:
--   [1] mode                     "only_once" | "strictly_once"
--   [2] duration_ms              1..=2^40-1
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] retention_ms             1..=2^40-1
--   [5] max_batch                1..=100000
--   Arguments after [5] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, clock, removed, retry_after_ms, windows_pruned}
--   SWEPT               `removed` events and `windows_pruned` windows removed
--   CLOCK_UNSAFE, STATE_INCOMPATIBLE, INVALID: as gate-submit-v1.lua; nothing changed
--   Numbers are integers in 0..=2^53-1; fields that do not apply are 0.
--
-- State: see gate-submit-v1.lua.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local argv = ARGV
local mode, a2, a3, a4, a5 = argv[1], argv[2], argv[3], argv[4], argv[5]
if #KEYS ~= 8 or not a5 or (mode ~= 'only_once' and mode ~= 'strictly_once')
  or a2 == '' or a3 == '' or a4 == '' or a5 == '' or string.find(a2 .. a3 .. a4 .. a5, '%D') then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local duration, max_regression, retention, max_batch = a2 + 0, a3 + 0, a4 + 0, a5 + 0
if duration < 1 or duration > 1099511627775 or max_regression > 1099511627775 or retention < 1
  or retention > 1099511627775 or max_batch < 1 or max_batch > 100000 then
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

local cutoff = 0
if eff >= retention then
  cutoff = eff - retention + 1
end
-- terminal_at < cutoff, in (terminal_at, id) order.
local old = redis.pcall('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. fmt(cutoff), 'LIMIT', 0, max_batch)
local lapsed = redis.pcall('ZRANGEBYSCORE', KEYS[7], '-inf', fmt(eff), 'LIMIT', 0, max_batch)
if old.err or lapsed.err then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
end
for i = 1, #old do
  redis.call('ZREM', KEYS[5], old[i])
  redis.call('HDEL', KEYS[3], old[i])
end
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[7], lapsed[i])
  redis.call('HDEL', KEYS[6], lapsed[i])
end
redis.call('HSET', KEYS[2], 'mode', mode, 'duration', a2, 'now', fmt(eff))
return { 'SWEPT', now, eff, clock, #old, 0, #lapsed }
