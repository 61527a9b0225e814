-- gate-snapshot-v1.lua: reads one gate's incubating events and its clock in one atomic step
-- (the key frame; docs/event-gates.md). Read only: no TIME, no write.
--
-- KEYS: the eight keys of gate-submit-v1.lua, same order.
-- ARGV:
--   [1] mode         "only_once" | "strictly_once"
--   [2] duration_ms  1..=2^40-1
--
-- Reply: {status, clock, entries}
--   SNAPSHOT            entries = {id1, record1, id2, record2, ...} of the incubating events
--                       in due order (publish_at, id); records as in gate-submit-v1.lua
--   STATE_INCOMPATIBLE  wrong key type, another mode or duration, a due id without record
--   INVALID             an argument is missing or out of range
--   For STATE_INCOMPATIBLE and INVALID clock is 0 and entries is empty.

local mode, a2 = ARGV[1], ARGV[2]
if #KEYS ~= 8 or not a2 or (mode ~= 'only_once' and mode ~= 'strictly_once') or a2 == ''
  or string.find(a2, '%D') then
  return { 'INVALID', 0, {} }
end
local meta = redis.pcall('HMGET', KEYS[2], 'mode', 'duration')
local raw_clock = redis.pcall('GET', KEYS[1])
local due = redis.pcall('ZRANGE', KEYS[4], 0, -1)
if meta.err or due.err or (type(raw_clock) == 'table' and raw_clock.err) then
  return { 'STATE_INCOMPATIBLE', 0, {} }
end
if (meta[1] and (meta[1] ~= mode or meta[2] ~= a2)) or (raw_clock and string.find(raw_clock, '%D')) then
  return { 'STATE_INCOMPATIBLE', 0, {} }
end
local out = {}
-- HMGET in chunks: Lua's unpack is limited to a few thousand values.
local chunk = 1000
for i = 1, #due, chunk do
  local j = math.min(i + chunk - 1, #due)
  local recs = redis.call('HMGET', KEYS[3], unpack(due, i, j))
  for n = 1, #recs do
    if not recs[n] then
      return { 'STATE_INCOMPATIBLE', 0, {} }
    end
    out[#out + 1] = due[i + n - 1]
    out[#out + 1] = recs[n]
  end
end
return { 'SNAPSHOT', raw_clock and tonumber(raw_clock) or 0, out }
