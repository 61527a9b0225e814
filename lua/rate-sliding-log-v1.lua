-- rate-sliding-log-v1.lua: one sliding-log decision, atomically, on one key.
--
-- Mirrors shared-contract's model::sliding_log operation for operation: exact; it remembers
-- every admitted (time, cost) still inside the window and admits iff the cost in
-- (now - window_ms, now] plus this cost stays within limit. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV     decimal integers:
--   [1] cost                     1..=limit
--   [2] revision                 1..=2^32-1, recorded in state
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] cleanup_grace_ms         0..=2^40-1
--   [5] limit                    1..=1000 (bounds the entries, so memory and work)
--   [6] window_ms                1..=2^40-1
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
--   byte 1     tag 0x15 (high nibble: schema version 1; low nibble: algorithm 5, sliding log)
--   bytes 2-7  last_ms, unsigned little-endian, 6 bytes (time of the last allow)
--   varint     policy revision
--   then per entry, oldest first, until the end of the string (zero entries allowed):
--   varint     age = last_ms - time (strictly decreasing: times strictly increase, <= last_ms)
--   varint     cost (>= 1; all costs sum to <= limit)
--   A varint is unsigned LEB128 (7 bits per byte, low group first, high bit set on every
--   byte but the last), at most 8 bytes.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local MAX_SAFE = 9007199254740991 -- 2^53-1
local MAX_TIME = 281474976710655 -- 2^48-1
local MAX_DURATION = 1099511627775 -- 2^40-1
local TAG = 0x15
local MAX_LIMIT = 1000 -- shared-contract SLIDING_LOG_MAX_LIMIT
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
local limit = arg(5, 1, MAX_LIMIT)
local w = arg(6, 1, MAX_DURATION)
if not (cost and revision and max_regression and grace and limit and w)
  or #KEYS ~= 1 or now > MAX_TIME or cost > limit then
  return answer('INVALID', 0, 0, 0, 0, 0)
end

-- A wrong key type comes back as an error table, never raised.
local raw = redis.pcall('GET', KEYS[1])
local last
-- Entry times and costs, oldest first.
local times, costs, count = {}, {}, 0
if raw then
  if type(raw) ~= 'string' then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  local n = #raw
  -- At most limit entries of two 8-byte varints; the bound also keeps string.byte's slices
  -- within the Lua stack.
  if n < 8 or n > 12 + 16 * limit then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  local b
  if n <= 4096 then
    b = { byte(raw, 1, n) }
  else
    b = {}
    for k = 1, n, 4096 do
      local hi = k + 4095
      if hi > n then
        hi = n
      end
      local part = { byte(raw, k, hi) }
      for j = 1, #part do
        b[k + j - 1] = part[j]
      end
    end
  end
  if b[1] ~= TAG then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  last = b[2] + 256 * (b[3] + 256 * (b[4] + 256 * (b[5] + 256 * (b[6] + 256 * b[7]))))
  local rev, i = varint(b, 8, n)
  if rev ~= revision then
    return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
  end
  -- Six bytes cannot exceed MAX_TIME, so last_ms needs no range check.
  local sum, prev_age = 0, nil
  while i <= n do
    local age, c
    age, i = varint(b, i, n)
    if age == nil then
      return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
    end
    c, i = varint(b, i, n)
    if c == nil or c == 0 or age > last or (prev_age and age >= prev_age) then
      return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
    end
    sum = sum + c
    if sum > limit then
      return answer('STATE_INCOMPATIBLE', 0, 0, 0, 0, 0)
    end
    prev_age = age
    count = count + 1
    times[count] = last - age
    costs[count] = c
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

-- Entries with time + w <= eff have left the window (time > eff - w, without negatives).
local first_live = 1
while first_live <= count and times[first_live] + w <= eff do
  first_live = first_live + 1
end
local live_sum = 0
for k = first_live, count do
  live_sum = live_sum + costs[k]
end
local available = limit - live_sum

if cost <= available then
  local out = { TAG }
  local x = eff
  for _ = 1, 6 do
    local r = x % 256
    out[#out + 1] = r
    x = (x - r) / 256
  end
  put_varint(out, revision)
  -- The new entry merges into the newest one when it has the same time.
  local merge = count >= first_live and times[count] == eff
  local upto = count
  if merge then
    upto = count - 1
  end
  for k = first_live, upto do
    put_varint(out, eff - times[k])
    put_varint(out, costs[k])
  end
  if merge then
    put_varint(out, 0)
    put_varint(out, costs[count] + cost)
  else
    put_varint(out, 0)
    put_varint(out, cost)
  end
  redis.call('SET', KEYS[1], char(unpack(out)), 'PX', w + grace)
  return answer('ALLOWED', eff, limit, available - cost, 0, eff + w)
end

local reset_at = eff
if count >= first_live then
  reset_at = times[count] + w
end
-- Let the oldest entries leave until the rest plus cost fits.
local retry = 0
local left = live_sum
for k = first_live, count do
  left = left - costs[k]
  if cost <= limit - left then
    retry = times[k] + w - eff
    break
  end
end
return answer('DENIED', eff, limit, available, retry, reset_at)
