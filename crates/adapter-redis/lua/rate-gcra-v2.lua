-- rate-gcra-v2.lua: one GCRA (generic cell rate algorithm) decision, atomically, on one key.
--
-- Mirrors shared-contract's model::gcra operation for operation. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS[1]  the state key; no other key is touched.
-- ARGV[1]  the arguments packed in one string of 40 bytes: unsigned little-endian
--          integers (Redis's struct library, format '<I7I4I5I5I7I5I7'), in this order:
--   cost                     I7  1..=burst
--   revision                 I4  1..=2^32-1, recorded in state
--   max_clock_regression_ms  I5  0..=2^40-1
--   cleanup_grace_ms         I5  0..=2^40-1
--   burst                    I7  1..=2^53-1 (cost admissible at once)
--   interval_units           I5  1..=2^40-1 (emission interval of one cost unit, time units)
--   units_per_ms             I7  1..=2^53-1 (time units per ms)
--   with burst * interval_units <= 2^53-1 and ceil(burst * interval_units / units_per_ms)
--   <= 2^40-1.
--   A width caps its field (I5: 2^40-1), so only the bounds a width does not imply are
--   checked. Arguments after [1] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, limit, remaining, retry_after_ms,
--         reset_at_ms}; status a bulk string, the rest integers in 0..=2^53-1.
--   ALLOWED             admitted; state written with SET ... PX ttl (ttl >= 1) to its deadline:
--                       reset_at_ms + cleanup_grace_ms rounded up to a quantum (an eighth
--                       of the time a full burst takes to repay, at most cleanup_grace_ms -
--                       max_clock_regression_ms, at least 1 ms), less
--                       server_now_ms; or with SET ... KEEPTTL when the stored state's
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
-- State: one string of unsigned little-endian integers (Redis's struct library), in one of
-- two layouts; the writer picks the compact one whenever the values fit it:
--   compact, 12 bytes: tag 0x94 (1), last_ms (6), revision (1, < 2^8),  debt (4, < 2^32)
--   wide,    18 bytes: tag 0x14 (1), last_ms (6), revision (4),         debt (7)
--   in overdraft, 25 bytes (written by a settlement only): tag 0x24 (1), last_ms (6),
--                      revision (4), debt (7, the tolerance), overdraft (7: debt beyond it,
--                      repaid with the rest)
--   tag: bit 7 set for the compact layout, bits 4-6 the schema version (1), bits 0-3 the
--   algorithm (4, GCRA). last_ms is the time of the last allow; debt = TAT - last_ms in
--   time units (0..=burst * interval_units). 12 bytes is the largest value Redis keeps in
--   its smallest string allocation.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- Everything is inline: the chunk runs once per call, so every helper function would be a
-- new closure per call.
local A = ARGV[1]
-- One length check stands for the arity and type checks of separate arguments.
if #KEYS ~= 1 or not A or #A ~= 40 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
local cost, revision, max_regression, grace, burst, interval, rate =
  struct.unpack('<I7I4I5I5I7I5I7', A)
-- A field beyond 2^53 unpacks inexactly but still above every bound.
if cost < 1 or cost > burst or revision < 1 or burst > 9007199254740991 or interval < 1
  or rate < 1 or rate > 9007199254740991 or now > 281474976710655 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
-- A product beyond 2^53 is inexact but still above 2^53-1, so this check is exact.
local tolerance = burst * interval
if tolerance > 9007199254740991 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
end
-- Full recovery, ceil(tolerance / rate), by quotient and remainder.
local q = (tolerance - tolerance % rate) / rate
if tolerance - q * rate ~= 0 then
  q = q + 1
end
if q > 1099511627775 then
  return { 'INVALID', now, 0, 0, 0, 0, 0 }
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
    if tag ~= 0x94 then
      n = nil
    end
  elseif n == 18 then
    tag, last, rev, stored = struct.unpack('<BI6I4I7', raw)
    if tag ~= 0x14 then
      n = nil
    end
  elseif n == 25 then
    tag, last, rev, stored, over = struct.unpack('<BI6I4I7I7', raw)
    -- The most a policy may owe: what takes 2^40-1 ms to repay (a product beyond 2^53 is
    -- inexact but still above 2^53-1, then capped).
    local most = rate * 1099511627775
    if most > 9007199254740991 then
      most = 9007199254740991
    end
    if tag ~= 0x24 or (over > 0 and stored ~= tolerance) or over > most - tolerance then
      n = nil
    end
  else
    n = nil
  end
  -- Six bytes cannot exceed 2^48-1, so last_ms needs no range check.
  if not n or rev ~= revision or stored > tolerance then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
  end
end

-- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
local eff = now
if last and now < last then
  if last - now > max_regression then
    return { 'CLOCK_UNSAFE', now, last, burst, 0, last - now, last }
  end
  eff = last
end
-- @state end

local debt, paid_at = 0, nil
if last then
  -- Paid off once elapsed * rate >= debt (the overdraft included); the product is formed
  -- only when it is smaller.
  local total = stored + over
  local elapsed = eff - last
  local paid = (total - total % rate) / rate
  if total - paid * rate ~= 0 then
    paid = paid + 1
  end
  paid_at = last + paid
  if elapsed < paid then
    debt = total - elapsed * rate
  end
end

local need = cost * interval
-- Negative in overdraft: then nothing is admissible.
local credit = tolerance - debt
if need > credit then
  local short = need - credit
  local retry = (short - short % rate) / rate
  if short - retry * rate ~= 0 then
    retry = retry + 1
  end
  local to_reset = (debt - debt % rate) / rate
  if debt - to_reset * rate ~= 0 then
    to_reset = to_reset + 1
  end
  local left = 0
  if credit > 0 then
    left = (credit - credit % interval) / interval
  end
  return { 'DENIED', now, eff, burst, left, retry, eff + to_reset }
end

debt = debt + need
local to_reset = (debt - debt % rate) / rate
if debt - to_reset * rate ~= 0 then
  to_reset = to_reset + 1
end
local value
if revision < 256 and debt < 4294967296 then
  value = struct.pack('<BI6I1I4', 0x94, eff, revision, debt)
else
  value = struct.pack('<BI6I4I7', 0x14, eff, revision, debt)
end
-- The deadline: repaid, plus the grace, rounded up to the quantum, on this clock (the
-- operator %, not math.floor: no function call). A stored state with the same deadline had
-- it set already: keep it (false). An allow only moves the time it is repaid later, so the
-- stored state's deadline is this one exactly when its own due is past the quantum's start.
local quantum = (q - q % 8) / 8
if quantum > grace - max_regression then
  quantum = grace - max_regression
end
if quantum < 1 then
  quantum = 1
end
local due = eff + to_reset + grace
local deadline = due - due % quantum
if deadline < due then
  deadline = deadline + quantum
end
local ttl = deadline - now
if paid_at and paid_at + grace > deadline - quantum then
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
return { 'ALLOWED', now, eff, burst, (tolerance - debt - (tolerance - debt) % interval) / interval, 0, eff + to_reset }
