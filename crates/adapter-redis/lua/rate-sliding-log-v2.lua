-- rate-sliding-log-v2.lua: one sliding-log decision, atomically, on one key.
--
-- Mirrors shared-contract's model::sliding_log operation for operation: exact; it remembers
-- every admitted (time, cost) still inside the window and admits iff the cost in
-- (now - window_ms, now] plus this cost stays within limit. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV[1]  the arguments packed in one string of 28 bytes: unsigned little-endian
--          integers (Redis's struct library, format '<I7I4I5I5I2I5'), in this order:
--   cost                     I7  1..=limit
--   revision                 I4  1..=2^32-1, recorded in state
--   max_clock_regression_ms  I5  0..=2^40-1
--   cleanup_grace_ms         I5  0..=2^40-1
--   limit                    I2  1..=1000 (bounds the entries, so memory and work)
--   window_ms                I5  1..=2^40-1
--   A width caps its field (I5: 2^40-1), so only the bounds a width does not imply are
--   checked. Arguments after [1] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, limit, remaining, retry_after_ms,
--         reset_at_ms}; status a bulk string, the rest integers in 0..=2^53-1.
--   ALLOWED             admitted; state written with SET ... PX ttl (ttl >= 1) to its deadline:
--                       reset_at_ms (when the newest entry leaves the window) +
--                       cleanup_grace_ms rounded up to a quantum (an eighth of the window,
--                       at most cleanup_grace_ms - max_clock_regression_ms, at least 1 ms),
--                       less server_now_ms; or with SET ... KEEPTTL when the stored state's
--                       deadline is the same
--   DENIED              not admitted; nothing written
--   CLOCK_UNSAFE        TIME is behind the stored last_ms by more than the allowed
--                       regression; nothing written
--   STATE_INCOMPATIBLE  the key holds another type, or a value that is not this schema,
--                       algorithm and revision, or a field out of range; nothing written
--   INVALID             ARGV[1] is missing or not of its length, or a field is out of range
--                       (also a clock beyond 2^48-1 ms); nothing written
--   For STATE_INCOMPATIBLE and INVALID every numeric field but server_now_ms is 0.
--
-- State: one string of unsigned little-endian integers (Redis's struct library): a header,
-- then one (age, cost) pair per entry, oldest first, age = last_ms - time (so ages strictly
-- decrease, every entry time <= last_ms), every cost >= 1, all costs summing to <= limit.
-- Two layouts; the writer picks the compact one whenever the values fit it:
--   compact: tag 0x95 (1), last_ms (6), revision (1, < 2^8);  entries age (3), cost (1)
--   wide:    tag 0x15 (1), last_ms (6), revision (4);         entries age (5), cost (2)
--   tag: bit 7 set for the compact layout, bits 4-6 the schema version (1), bits 0-3 the
--   algorithm (5, sliding log). last_ms is the time of the last allow. One compact entry
--   is 12 bytes, the largest value Redis keeps in its smallest string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- Everything is inline: the chunk runs once per call, so every helper function would be a
-- new closure per call.
local A = ARGV[1]
-- One length check stands for the arity and type checks of separate arguments.
if #KEYS ~= 1 or not A or #A ~= 28 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local cost, revision, max_regression, grace, limit, window = struct.unpack('<I7I4I5I5I2I5', A)
-- A field beyond 2^53 unpacks inexactly but still above every bound.
if cost < 1 or cost > limit or revision < 1 or limit > 1000 or window < 1
  or now > 281474976710655 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end

-- A wrong key type comes back as an error table, never raised.
local raw = redis.pcall('GET', KEYS[1])
local last
-- Entry times and costs, oldest first.
local times, costs, count = {}, {}, 0
if raw then
  local n = type(raw) == 'string' and #raw
  local v, k, tag, rev
  -- The entry count follows from the length; it is bounded (by limit) before unpacking.
  if n and n >= 8 and (n - 8) % 4 == 0 and (n - 8) / 4 <= limit
    and string.byte(raw) == 0x95 then
    k = (n - 8) / 4
    v = { struct.unpack('<BI6I1' .. string.rep('I3I1', k), raw) }
  elseif n and n >= 11 and (n - 11) % 7 == 0 and (n - 11) / 7 <= limit
    and string.byte(raw) == 0x15 then
    k = (n - 11) / 7
    v = { struct.unpack('<BI6I4' .. string.rep('I5I2', k), raw) }
  end
  if not v or v[3] ~= revision then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
  -- Six bytes cannot exceed 2^48-1, so last_ms needs no range check.
  last = v[2]
  local sum, prev_age = 0, nil
  for j = 1, k do
    local age, c = v[2 + 2 * j], v[3 + 2 * j]
    if c == 0 or age > last or (prev_age and age >= prev_age) then
      return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
    end
    sum = sum + c
    prev_age = age
    times[j] = last - age
    costs[j] = c
  end
  if sum > limit then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
  count = k
end

-- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
local eff = now
if last and now < last then
  if last - now > max_regression then
    return { 'CLOCK_UNSAFE', now, last, limit, 0, last - now, last }
  end
  eff = last
end

local w = window
-- Entries with time + w <= eff have left the window (time > eff - w, without negatives).
local first_live = 1
while first_live <= count and times[first_live] + w <= eff do
  first_live = first_live + 1
end
local live_sum = 0
for j = first_live, count do
  live_sum = live_sum + costs[j]
end
local available = limit - live_sum

if cost <= available then
  -- The kept entries, then the new one merged into the newest when it has the same time.
  local vals, m, compact = {}, 0, revision < 256
  for j = first_live, count do
    local age, c = eff - times[j], costs[j]
    if j == count and age == 0 then
      c = c + cost
    end
    if age >= 16777216 or c >= 256 then
      compact = false
    end
    vals[m + 1] = age
    vals[m + 2] = c
    m = m + 2
  end
  if count < first_live or times[count] ~= eff then
    if cost >= 256 then
      compact = false
    end
    vals[m + 1] = 0
    vals[m + 2] = cost
    m = m + 2
  end
  local value
  if compact then
    value = struct.pack('<BI6I1' .. string.rep('I3I1', m / 2), 0x95, eff, revision,
      unpack(vals, 1, m))
  else
    value = struct.pack('<BI6I4' .. string.rep('I5I2', m / 2), 0x15, eff, revision,
      unpack(vals, 1, m))
  end
  -- The deadline: the new entry leaves the window, plus the grace, rounded up to the quantum
  -- (an eighth of the window, at most grace less max_regression, at least 1), on this clock.
  -- The stored state's newest entry set its deadline the same way: when it rounds to this
  -- one, keep it (false).
  local quantum = (w - w % 8) / 8
  if quantum > grace - max_regression then
    quantum = grace - max_regression
  end
  if quantum < 1 then
    quantum = 1
  end
  local due = eff + w + grace
  local deadline = due - due % quantum
  if deadline < due then
    deadline = deadline + quantum
  end
  local ttl = deadline - now
  if count >= 1 and times[count] + w + grace > deadline - quantum then
    ttl = false
  end
  -- @write begin
  if ttl then
    -- The TTL as a string: Redis would format a number argument with snprintf('%.17g'),
    -- about 1,000 instructions more than string.format('%d').
    redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
  else
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  end
  -- @write end
  return { 'ALLOWED', now, eff, limit, available - cost, 0, eff + w }
end

local reset_at = eff
if count >= first_live then
  reset_at = times[count] + w
end
-- Let the oldest entries leave until the rest plus cost fits.
local retry = 0
local left = live_sum
for j = first_live, count do
  left = left - costs[j]
  if cost <= limit - left then
    retry = times[j] + w - eff
    break
  end
end
return { 'DENIED', now, eff, limit, available, retry, reset_at }
