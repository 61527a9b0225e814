-- rate-fixed-window-v2.lua: one fixed-window decision, atomically, on one key.
--
-- Mirrors shared-contract's model::fixed_window operation for operation. Windows are aligned
-- to the Unix epoch: [k * window_ms, (k + 1) * window_ms), or are calendar periods whose
-- bounds the caller sends. Calling convention: docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV[1]  the arguments packed in one string of 33 bytes: unsigned little-endian
--          integers (Redis's struct library, format '<I7I4I5I5I7I5'), in this order:
--   cost                     I7  1..=limit
--   revision                 I4  1..=2^32-1, recorded in state
--   max_clock_regression_ms  I5  0..=2^40-1
--   cleanup_grace_ms         I5  0..=2^40-1
--   limit                    I7  1..=2^53-1
--   window_ms                I5  1..=2^40-1
--   or of 57 bytes for calendar periods: the same, then four window bounds b0 < b1 < b2 < b3
--   (I6 each, Unix ms: the windows [b0, b1), [b1, b2), [b2, b3), the caller's previous,
--   current and next period by its clock); the window is the one holding the effective
--   time, and none holding it is CLOCK_UNSAFE (the caller's clock and TIME disagree by
--   more than a period; retry_after_ms 1000).
--   A width caps its field (I5: 2^40-1), so only the bounds a width does not imply are
--   checked. Arguments after [1] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, limit, remaining, retry_after_ms,
--         reset_at_ms}; status a bulk string, the rest integers in 0..=2^53-1.
--   ALLOWED             admitted; state written with SET ... PX ttl (ttl >= 1), the window's
--                       deadline reset_at_ms + cleanup_grace_ms - server_now_ms, or with
--                       SET ... KEEPTTL when the stored state is of the same window
--   DENIED              not admitted; nothing written
--   CLOCK_UNSAFE        TIME is behind the stored last_ms by more than the allowed
--                       regression; nothing written
--   STATE_INCOMPATIBLE  the key holds another type, or a value that is not this schema,
--                       algorithm and revision, or a field out of range; nothing written
--   INVALID             ARGV[1] is missing or not of its length, or a field is out of range
--                       (also a clock beyond 2^48-1 ms); nothing written
--   For STATE_INCOMPATIBLE and INVALID every numeric field but server_now_ms is 0.
--
-- State: one string of unsigned little-endian integers (Redis's struct library), in one of
-- two layouts; the writer picks the compact one whenever the values fit it:
--   compact, 12 bytes: tag 0x91 (1), last_ms (6), revision (1, < 2^8),  count (4, < 2^32)
--   wide,    18 bytes: tag 0x11 (1), last_ms (6), revision (4),         count (7)
--   in overdraft, 25 bytes (written by a settlement only): tag 0x21 (1), last_ms (6),
--                      revision (4), count (7, the limit), overdraft (7, <= 2^53-1 - limit)
--   tag: bit 7 set for the compact layout, bits 4-6 the schema version (1), bits 0-3 the
--   algorithm (1, fixed window). last_ms is the time of the last allow; count is the cost
--   consumed in the window of last_ms (0..=limit). 12 bytes is the largest value Redis
--   keeps in its smallest string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- Everything is inline: the chunk runs once per call, so every helper function would be a
-- new closure per call.
local A = ARGV[1]
-- One length check stands for the arity and type checks of separate arguments.
if #KEYS ~= 1 or not A or (#A ~= 33 and #A ~= 57) then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local cost, revision, max_regression, grace, limit, window = struct.unpack('<I7I4I5I5I7I5', A)
-- A field beyond 2^53 unpacks inexactly but still above every bound.
if cost < 1 or cost > limit or revision < 1 or limit > 9007199254740991 or window < 1
  or now > 281474976710655 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local b0, b1, b2, b3
if #A == 57 then
  b0, b1, b2, b3 = struct.unpack('<I6I6I6I6', A, 34)
  if b0 >= b1 or b1 >= b2 or b2 >= b3 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
end

-- A wrong key type comes back as an error table, never raised.
-- @state begin
local raw = redis.pcall('GET', KEYS[1])
local last, stored
local over = 0
if raw then
  local n = type(raw) == 'string' and #raw
  local tag, rev
  if n == 12 then
    tag, last, rev, stored = struct.unpack('<BI6I1I4', raw)
    if tag ~= 0x91 then
      n = nil
    end
  elseif n == 18 then
    tag, last, rev, stored = struct.unpack('<BI6I4I7', raw)
    if tag ~= 0x11 then
      n = nil
    end
  elseif n == 25 then
    tag, last, rev, stored, over = struct.unpack('<BI6I4I7I7', raw)
    if tag ~= 0x21 or (over > 0 and stored ~= limit) or over > 9007199254740991 - limit then
      n = nil
    end
  else
    n = nil
  end
  -- Six bytes cannot exceed 2^48-1, so last_ms needs no range check. An overdraft leaves
  -- the count at the limit: nothing more is admitted in its window.
  if not n or rev ~= revision or stored > limit then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
end

-- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
local eff = now
if last and now < last then
  if last - now > max_regression then
    return { 'CLOCK_UNSAFE', now, last, limit, 0, last - now, last }
  end
  eff = last
end
-- @state end

local window_start, reset_at
if not b0 then
  window_start = eff - eff % window
  reset_at = window_start + window
elseif eff >= b0 and eff < b1 then
  window_start, reset_at = b0, b1
elseif eff >= b1 and eff < b2 then
  window_start, reset_at = b1, b2
elseif eff >= b2 and eff < b3 then
  window_start, reset_at = b2, b3
else
  return { 'CLOCK_UNSAFE', now, eff, limit, 0, 1000, eff }
end
-- Every write of a window sets one deadline, reset_at + grace on this clock (longer under a
-- regression than from eff, never shorter); a write into the window of the stored state
-- finds it set already and keeps it (false), which saves Redis rewriting the expiry.
local count, ttl = 0, reset_at - now + grace
if last and last >= window_start then
  count, ttl = stored, false
end
local available = limit - count
if cost > available then
  return { 'DENIED', now, eff, limit, available, reset_at - eff, reset_at }
end

count = count + cost
local value
if revision < 256 and count < 4294967296 then
  value = struct.pack('<BI6I1I4', 0x91, eff, revision, count)
else
  value = struct.pack('<BI6I4I7', 0x11, eff, revision, count)
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
return { 'ALLOWED', now, eff, limit, limit - count, 0, reset_at }
