-- rate-sliding-counter-v2.lua: one sliding-window-counter decision, atomically, on one key.
--
-- Mirrors shared-contract's model::sliding_window operation for operation: the previous
-- window's count weighted by the share of it still inside the sliding window (S = 1_000_000,
-- rounded up), plus the current window's count. An estimate: the provider reports it as
-- approximate. Calling convention: docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV[1]  the arguments packed in one string of 31 bytes: unsigned little-endian
--          integers (Redis's struct library, format '<I7I4I5I5I5I5'), in this order:
--   cost                     I7  1..=limit
--   revision                 I4  1..=2^32-1, recorded in state
--   max_clock_regression_ms  I5  0..=2^40-1
--   cleanup_grace_ms         I5  0..=2^40-1
--   limit                    I5  1..=floor((2^53-1) / S) = 9007199254
--   window_ms                I5  1..=floor((2^53-1) / S) = 9007199254
--   A width caps its field (I5: 2^40-1), so only the bounds a width does not imply are
--   checked. Arguments after [1] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, limit, remaining, retry_after_ms,
--         reset_at_ms}; status a bulk string, the rest integers in 0..=2^53-1.
--   ALLOWED             admitted; state written with SET ... PX ttl (ttl >= 1) to its deadline,
--                       reset_at_ms + cleanup_grace_ms - server_now_ms, or with SET ...
--                       KEEPTTL when the stored state counts in this window (same deadline)
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
--   compact, 12 bytes: tag 0x92 (1), last_ms (6), revision (1, < 2^8),
--                      previous (2, < 2^16), current (2, < 2^16)
--   wide,    21 bytes: tag 0x12 (1), last_ms (6), revision (4), previous (5), current (5)
--   in overdraft, 28 bytes (written by a settlement only): tag 0x22 (1), last_ms (6),
--                      revision (4), previous (5), current (5, the limit), overdraft (7);
--                      the overdraft counts in its own window only
--   tag: bit 7 set for the compact layout, bits 4-6 the schema version (1), bits 0-3 the
--   algorithm (2, sliding window counter). last_ms is the time of the last allow; previous
--   counts the window before that of last_ms, current the window of last_ms (each
--   0..=limit). 12 bytes is the largest value Redis keeps in its smallest string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- Everything is inline: the chunk runs once per call, so every helper function would be a
-- new closure per call.
local A = ARGV[1]
-- One length check stands for the arity and type checks of separate arguments.
if #KEYS ~= 1 or not A or #A ~= 31 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local cost, revision, max_regression, grace, limit, window = struct.unpack('<I7I4I5I5I5I5', A)
-- A field beyond 2^53 unpacks inexactly but still above every bound.
if cost < 1 or cost > limit or revision < 1 or limit > 9007199254 or window < 1
  or window > 9007199254 or now > 281474976710655 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end

local S = 1000000 -- fixed-point scale of the previous window's weight

-- A wrong key type comes back as an error table, never raised.
-- @state begin
local raw = redis.pcall('GET', KEYS[1])
local last, s_previous, s_current
local s_over = 0
if raw then
  local n = type(raw) == 'string' and #raw
  local tag, rev
  if n == 12 then
    tag, last, rev, s_previous, s_current = struct.unpack('<BI6I1I2I2', raw)
    if tag ~= 0x92 then
      n = nil
    end
  elseif n == 21 then
    tag, last, rev, s_previous, s_current = struct.unpack('<BI6I4I5I5', raw)
    if tag ~= 0x12 then
      n = nil
    end
  elseif n == 28 then
    tag, last, rev, s_previous, s_current, s_over = struct.unpack('<BI6I4I5I5I7', raw)
    if tag ~= 0x22 or (s_over > 0 and s_current ~= limit)
      or s_over > 9007199254740991 - limit then
      n = nil
    end
  else
    n = nil
  end
  -- Six bytes cannot exceed 2^48-1, so last_ms needs no range check.
  if not n or rev ~= revision or s_previous > limit or s_current > limit then
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

local w = window
local elapsed = eff % w
local window_start = eff - elapsed
local previous, current = 0, 0
if last then
  local last_start = last - last % w
  if last_start == window_start then
    previous, current = s_previous, s_current
  elseif last_start + w == window_start then
    previous = s_current
  end
end
-- weight = ceil((w - elapsed) * S / w); estimate = ceil(previous * weight / S) + current.
-- The estimate: current plus ceil(previous * weight / S), weight = ceil((w - elapsed) * S / w).
-- Without a previous count (a key's first window, or after a quiet one) it is current.
local estimate = current
if previous > 0 then
  local scaled = (w - elapsed) * S
  local weight = (scaled - scaled % w) / w
  if scaled - weight * w ~= 0 then
    weight = weight + 1
  end
  local weighted = previous * weight
  local carried = (weighted - weighted % S) / S
  if weighted - carried * S ~= 0 then
    carried = carried + 1
  end
  estimate = estimate + carried
end
-- Only planted state can push the estimate past the limit; it then admits nothing.
local available = 0
if estimate < limit then
  available = limit - estimate
end

if cost <= available then
  -- The deadline: the end of the next window plus the grace, on this clock (longer under a
  -- regression than from eff, never shorter). A stored state counting in this window has
  -- it set already: keep it (false).
  local reset_at = window_start + 2 * w
  local ttl = reset_at - now + grace
  if current > 0 then
    ttl = false
  end
  current = current + cost
  local value
  if revision < 256 and previous < 65536 and current < 65536 then
    value = struct.pack('<BI6I1I2I2', 0x92, eff, revision, previous, current)
  else
    value = struct.pack('<BI6I4I5I5', 0x12, eff, revision, previous, current)
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
  return { 'ALLOWED', now, eff, limit, available - cost, 0, reset_at }
end

local reset_at = eff
if current > 0 then
  reset_at = window_start + 2 * w
elseif previous > 0 then
  reset_at = window_start + w
end

-- Earliest offset e in [from, w) of a window where ceil(prev * weight(e) / S) <= room, or
-- nil when no offset of the window qualifies. (Defined here: only a denial needs it.)
local function first_offset(prev, room, from)
  if prev == 0 then
    return from
  end
  -- ceil(prev * weight / S) <= room  <=>  weight <= floor(room * S / prev) = m.
  local m = (room * S - room * S % prev) / prev
  if m >= S then
    return from
  end
  -- ceil((w - e) * S / w) <= m  <=>  w - e <= floor(m * w / S).
  local e = w - (m * w - m * w % S) / S
  if e < w then
    if e < from then
      return from
    end
    return e
  end
  return nil
end

-- The earliest time the estimate admits cost, assuming no other request: later in this
-- window (only if current leaves room), else in the next (previous := current), else at the
-- start of the one after (both counts gone).
local to_next = w - elapsed
local used = current + cost
local in_this = nil
if used <= limit then
  in_this = first_offset(previous, limit - used, elapsed)
end
local retry
if in_this then
  retry = in_this - elapsed
else
  local e = first_offset(current, limit - cost, 0)
  if e then
    retry = to_next + e
  else
    retry = to_next + w
  end
end
return { 'DENIED', now, eff, limit, available, retry, reset_at }
