-- gate-updates-v1.lua: reads the status updates of one gate after a cursor (the delta
-- frames; docs/event-gates.md). Read only: no TIME, no write, never blocks (a blocking read
-- would stall every other request pipelined on the same connection).
--
-- KEYS: the eight keys of gate-submit-v1.lua, same order.
-- ARGV:
--   [1] after  0..=2^53-1: the subscriber's clock
--   [2] max    1..=100000: most updates answered
--
-- Reply: {status, clock, resync, entries}
--   UPDATES             clock is the gate's clock; entries are the stream entries with a
--                       clock above `after`, oldest first, as XRANGE answers them
--                       ({{"<clock>-0", {"s", S|P|I, "i", id, "k", key, "a", at, "p", publish_at}}, ...});
--                       resync is 1 (and entries empty) when `after` is above the clock or
--                       the stream was trimmed past `after` (entries the subscriber never
--                       saw may be gone), else 0
--   STATE_INCOMPATIBLE  a key of another type
--   INVALID             an argument is missing or out of range
--   For STATE_INCOMPATIBLE and INVALID clock and resync are 0 and entries is empty.

local a1, a2 = ARGV[1], ARGV[2]
if #KEYS ~= 8 or not a2 or a1 == '' or a2 == '' or string.find(a1 .. a2, '%D') then
  return { 'INVALID', 0, 0, {} }
end
local after, max = a1 + 0, a2 + 0
if after > 9007199254740991 or max < 1 or max > 100000 then
  return { 'INVALID', 0, 0, {} }
end
local raw_clock = redis.pcall('GET', KEYS[1])
if (type(raw_clock) == 'table' and raw_clock.err) or (raw_clock and string.find(raw_clock, '%D')) then
  return { 'STATE_INCOMPATIBLE', 0, 0, {} }
end
local clock = raw_clock and tonumber(raw_clock) or 0
if after > clock then
  return { 'UPDATES', clock, 1, {} }
end
local exists = redis.call('EXISTS', KEYS[8])
if exists == 0 then
  return { 'UPDATES', clock, 0, {} }
end
local info = redis.pcall('XINFO', 'STREAM', KEYS[8])
if info.err then
  return { 'STATE_INCOMPATIBLE', 0, 0, {} }
end
local length, added, first = 0, 0, nil
for i = 1, #info, 2 do
  local f = info[i]
  if f == 'length' then
    length = info[i + 1]
  elseif f == 'entries-added' then
    added = info[i + 1]
  elseif f == 'first-entry' and type(info[i + 1]) == 'table' then
    first = tonumber(string.match(info[i + 1][1], '^(%d+)'))
  end
end
-- Trimmed entries all lie below the first kept one. A gap between the cursor and it may be
-- only rejections (which make no entry), but it cannot be told apart from a trimmed entry:
-- resync, conservatively.
if added > length and (first == nil or after + 1 < first) then
  return { 'UPDATES', clock, 1, {} }
end
local entries = redis.call('XRANGE', KEYS[8], string.format('%d', after + 1) .. '-0', '+', 'COUNT', max)
return { 'UPDATES', clock, 0, entries }
