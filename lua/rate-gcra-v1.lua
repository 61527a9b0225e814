-- rate-gcra-v1.lua: one GCRA (generic cell rate algorithm) decision, atomically, on one key.
--
-- Mirrors shared-contract's model::gcra operation for operation. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV     decimal integers:
--   [1] cost                     1..=burst
--   [2] revision                 1..=2^32-1, recorded in state
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] cleanup_grace_ms         0..=2^40-1
--   [5] burst                    1..=2^53-1 (cost admissible at once)
--   [6] interval_units           1..=2^40-1 (emission interval of one cost unit, time units)
--   [7] units_per_ms             1..=2^53-1 (time units per ms)
--   with burst * interval_units <= 2^53-1 and ceil(burst * interval_units / units_per_ms)
--   <= 2^40-1. Arguments after [7] are ignored (the test build reads `now` from the last one).
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
--   byte 1     tag 0x14 (high nibble: schema version 1; low nibble: algorithm 4, GCRA)
--   bytes 2-7  last_ms, unsigned little-endian, 6 bytes (time of the last allow)
--   varint     policy revision
--   varint     debt = TAT - last_ms, in time units (0..=burst * interval_units)
--   and nothing after. A varint is unsigned LEB128 (7 bits per byte, low group first, high
--   bit set on every byte but the last), at most 8 bytes. A typical policy stores 10-12
--   bytes: the value then fits the smallest Redis string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local MAX_SAFE = 9007199254740991 -- 2^53-1
local MAX_TIME = 281474976710655 -- 2^48-1
local MAX_DURATION = 1099511627775 -- 2^40-1
local TAG = 0x14
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

local cost = arg(1, 1, MAX_SAFE)
local revision = arg(2, 1, 4294967295)
local max_regression = arg(3, 0, MAX_DURATION)
local grace = arg(4, 0, MAX_DURATION)
local burst = arg(5, 1, MAX_SAFE)
local interval = arg(6, 1, MAX_DURATION)
local rate = arg(7, 1, MAX_SAFE)
if not (cost and revision and max_regression and grace and burst and interval and rate)
  or #KEYS ~= 1 or now > MAX_TIME or cost > burst then
  return answer('INVALID', 0, 0, 0, 0, 0)
end
-- A product beyond 2^53 is inexact but still above MAX_SAFE, so this check is exact.
local tolerance = burst * interval
if tolerance > MAX_SAFE or div_ceil(tolerance, rate) > MAX_DURATION then
  return answer('INVALID', 0, 0, 0, 0, 0)
end

-- A wrong key type comes back as an error table, never raised.
local raw = redis.pcall('GET', KEYS[1])
local last, stored
if raw then
  if type(raw) ~= 'string' then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  local n = #raw
  if n < 9 then
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
  stored, i = varint(b, i, n)
  -- Six bytes cannot exceed MAX_TIME, so last_ms needs no range check.
  if stored == nil or i ~= n + 1 or stored > tolerance then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
end

-- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
local eff = now
if last and now < last then
  if last - now > max_regression then
    return answer('CLOCK_UNSAFE', last, burst, 0, last - now, last)
  end
  eff = last
end

local debt = 0
if last then
  -- Paid off once elapsed * rate >= debt; the product is formed only when it is smaller.
  local elapsed = eff - last
  if elapsed < div_ceil(stored, rate) then
    debt = stored - elapsed * rate
  end
end

local need = cost * interval
local credit = tolerance - debt
if need > credit then
  return answer('DENIED', eff, burst, floor(credit / interval), div_ceil(need - credit, rate),
    eff + div_ceil(debt, rate))
end

debt = debt + need
local to_reset = div_ceil(debt, rate)
local out = { TAG }
local x = eff
for _ = 1, 6 do
  local r = x % 256
  out[#out + 1] = r
  x = (x - r) / 256
end
put_varint(out, revision)
put_varint(out, debt)
redis.call('SET', KEYS[1], char(unpack(out)), 'PX', to_reset + grace)
return answer('ALLOWED', eff, burst, floor((tolerance - debt) / interval), 0, eff + to_reset)
