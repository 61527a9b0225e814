-- rate-sliding-counter-v1.lua: one sliding-window-counter decision, atomically, on one key.
--
-- Mirrors shared-contract's model::sliding_window operation for operation: the previous
-- window's count weighted by the share of it still inside the sliding window (S = 1_000_000,
-- rounded up), plus the current window's count. An estimate: the provider reports it as
-- approximate. Calling convention: docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV     decimal integers:
--   [1] cost                     1..=limit
--   [2] revision                 1..=2^32-1, recorded in state
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] cleanup_grace_ms         0..=2^40-1
--   [5] limit                    1..=floor((2^53-1) / S)
--   [6] window_ms                1..=floor((2^53-1) / S)
--   Arguments after [6] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, limit, remaining, retry_after_ms,
--         reset_at_ms}; status a bulk string, the rest integers in 0..=2^53-1.
--   ALLOWED             admitted; state written with SET ... PX ttl (ttl >= 1)
--   DENIED              not admitted; nothing written
--   CLOCK_UNSAFE        TIME is behind the stored last_ms by more than the allowed
--                       regression; nothing written
--   STATE_INCOMPATIBLE  the key holds another type, or a value that is not this schema,
--                       algorithm and revision, or a field out of range; nothing written
--   INVALID             an argument is missing, not a decimal integer or out of range (also
--                       a clock beyond 2^48-1 ms); nothing written
--   For STATE_INCOMPATIBLE and INVALID every numeric field but server_now_ms is 0.
--
-- State: one string, in this order:
--   byte 1     tag 0x12 (high nibble: schema version 1; low nibble: algorithm 2, sliding
--              window counter)
--   bytes 2-7  last_ms, unsigned little-endian, 6 bytes (time of the last allow)
--   varint     policy revision
--   varint     previous: count of the window before that of last_ms (0..=limit)
--   varint     current: count of the window of last_ms (0..=limit)
--   and nothing after. A varint is unsigned LEB128 (7 bits per byte, low group first, high
--   bit set on every byte but the last), at most 8 bytes. With counts below 128 the value
--   is 10 bytes, below 16384 at most 12: it then fits the smallest Redis string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local MAX_SAFE = 9007199254740991 -- 2^53-1
local MAX_TIME = 281474976710655 -- 2^48-1
local MAX_DURATION = 1099511627775 -- 2^40-1
local TAG = 0x12
local S = 1000000 -- fixed-point scale of the previous window's weight
local floor, find, byte, char = math.floor, string.find, string.byte, string.char

local function answer(status, eff, limit, remaining, retry, reset)
  return { status, now, eff, limit, remaining, retry, reset }
end

-- ARGV[i] as a number in lo..=hi, or nil when it is missing, not decimal or out of range.
local function arg(i, lo, hi)
  local s = ARGV[i]
  if s == nil or #s > 16 or not find(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n < lo or n > hi then
    return nil
  end
  return n
end

-- ceil(a / b) by quotient and remainder (never a + b - 1).
local function div_ceil(a, b)
  local q = floor(a / b)
  if a - q * b == 0 then
    return q
  end
  return q + 1
end

-- The unsigned LEB128 varint at b[i]; returns value and next index, or nil past the end.
local function varint(b, i, n)
  local v, m = 0, 1
  local last = i + 7
  if last > n then
    last = n
  end
  for j = i, last do
    local x = b[j]
    if x < 128 then
      return v + x * m, j + 1
    end
    v = v + (x - 128) * m
    m = m * 128
  end
  return nil
end

local function put_varint(out, x)
  while x >= 128 do
    local r = x % 128
    out[#out + 1] = r + 128
    x = (x - r) / 128
  end
  out[#out + 1] = x
end

local MAX_SCALED = floor(MAX_SAFE / S)

-- Earliest offset e in [from, w) of a window where ceil(prev * weight(e) / S) <= room, or
-- nil when no offset of the window qualifies.
local function first_offset(w, prev, room, from)
  if prev == 0 then
    return from
  end
  -- ceil(prev * weight / S) <= room  <=>  weight <= floor(room * S / prev) = m.
  local m = floor(room * S / prev)
  if m >= S then
    return from
  end
  -- ceil((w - e) * S / w) <= m  <=>  w - e <= floor(m * w / S).
  local e = w - floor(m * w / S)
  if e < w then
    if e < from then
      return from
    end
    return e
  end
  return nil
end

local cost = arg(1, 1, MAX_SAFE)
local revision = arg(2, 1, 4294967295)
local max_regression = arg(3, 0, MAX_DURATION)
local grace = arg(4, 0, MAX_DURATION)
local limit = arg(5, 1, MAX_SCALED)
local w = arg(6, 1, MAX_SCALED)
if not (cost and revision and max_regression and grace and limit and w)
  or #KEYS ~= 1 or now > MAX_TIME or cost > limit then
  return answer('INVALID', 0, 0, 0, 0, 0)
end

-- A wrong key type comes back as an error table, never raised.
local raw = redis.pcall('GET', KEYS[1])
local last, s_previous, s_current
if raw then
  if type(raw) ~= 'string' then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  local n = #raw
  if n < 10 then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  local b = { byte(raw, 1, n) }
  if b[1] ~= TAG then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  last = b[2] + 256 * (b[3] + 256 * (b[4] + 256 * (b[5] + 256 * (b[6] + 256 * b[7]))))
  local rev, i = varint(b, 8, n)
  if rev ~= revision then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  s_previous, i = varint(b, i, n)
  if s_previous == nil or s_previous > limit then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  s_current, i = varint(b, i, n)
  -- Six bytes cannot exceed MAX_TIME, so last_ms needs no range check.
  if s_current == nil or i ~= n + 1 or s_current > limit then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
end

-- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
local eff = now
if last and now < last then
  if last - now > max_regression then
    return answer('CLOCK_UNSAFE', last, limit, 0, last - now, last)
  end
  eff = last
end

local elapsed = eff - floor(eff / w) * w
local window_start = eff - elapsed
local previous, current = 0, 0
if last then
  local last_start = last - (last - floor(last / w) * w)
  if last_start == window_start then
    previous, current = s_previous, s_current
  elseif last_start + w == window_start then
    previous = s_current
  end
end
local weight = div_ceil((w - elapsed) * S, w)
local estimate = div_ceil(previous * weight, S) + current
-- Only planted state can push the estimate past the limit; it then admits nothing.
local available = 0
if estimate < limit then
  available = limit - estimate
end

if cost <= available then
  current = current + cost
  local reset_at = window_start + 2 * w
  local out = { TAG }
  local x = eff
  for _ = 1, 6 do
    local r = x % 256
    out[#out + 1] = r
    x = (x - r) / 256
  end
  put_varint(out, revision)
  put_varint(out, previous)
  put_varint(out, current)
  redis.call('SET', KEYS[1], char(unpack(out)), 'PX', reset_at - eff + grace)
  return answer('ALLOWED', eff, limit, available - cost, 0, reset_at)
end

local reset_at = eff
if current > 0 then
  reset_at = window_start + 2 * w
elseif previous > 0 then
  reset_at = window_start + w
end
-- The earliest time the estimate admits cost, assuming no other request: later in this
-- window (only if current leaves room), else in the next (previous := current), else at the
-- start of the one after (both counts gone).
local to_next = w - elapsed
local used = current + cost
local in_this = nil
if used <= limit then
  in_this = first_offset(w, previous, limit - used, elapsed)
end
local retry
if in_this then
  retry = in_this - elapsed
else
  local e = first_offset(w, current, limit - cost, 0)
  if e then
    retry = to_next + e
  else
    retry = to_next + w
  end
end
return answer('DENIED', eff, limit, available, retry, reset_at)
