-- rate-multi-v2.lua: 1..=8 rate-limit decisions of mixed algorithms, all or nothing, in one
-- call, with an optional evaluation id that makes a retry answer the first decision again.
--
-- Mirrors shared-contract's model::multi::evaluate_all: every member is decided exactly as
-- its single program decides it (the member functions below are those programs' bodies, so
-- each member reads and writes the same state encoding), at one TIME reading; state is
-- written only when every member admits. Calling convention: docs/lua-programs.md.
--
-- KEYS     [1..n] the members' state keys, in member order; [n+1] the replay key, present
--          exactly when replay_window_ms > 0. No other key is touched.
-- ARGV     [1] the header, 5 bytes packed like a single program's arguments ('<I1I4'):
--   n                  I1  1..=8, the number of members
--   replay_window_ms   I4  0 (no evaluation id) or 1..=86400000, the replay key's PX
--   then two per member, in order:
--   [.] algorithm          decimal: 1 fixed window, 2 sliding counter, 3 token bucket,
--                          4 GCRA, 5 sliding log
--   [.] arguments          exactly ARGV[1] of the member's single program (its packed cost,
--                          revision, max_clock_regression_ms, cleanup_grace_ms, parameters)
--   Arguments after the last member are ignored (the test build reads `now` from the last).
--
-- Reply: {status, replayed, index, row_1, ..., row_n}; status a bulk string, replayed 0 or 1,
--   index 0 or the 1-based member (n+1: the replay key) the status concerns, and row_i the
--   member's seven-field reply exactly as its single program answers it (a nested array;
--   every row is present unless nothing was evaluated: an INVALID header or algorithm code
--   or missing arguments, or a STATE_INCOMPATIBLE replay key (index n+1) has no rows).
--   ALLOWED             every member admitted; every member's state written (SET ... PX,
--                       or KEEPTTL where its single program keeps the expiry)
--   DENIED              a member denied; nothing written (admitting rows still say ALLOWED)
--   CLOCK_UNSAFE        member `index` (the first such) saw TIME too far behind its state;
--                       nothing written
--   STATE_INCOMPATIBLE  member `index` (the first refused one) holds state of another type,
--                       schema, algorithm or revision, or index n+1: the replay key holds
--                       something this program did not write; nothing written
--   INVALID             the header, or member `index`'s algorithm or arguments, are not
--                       acceptable; nothing written
--   STATE_INCOMPATIBLE and INVALID take precedence over CLOCK_UNSAFE (as in the model, a
--   refused member refuses the whole evaluation). An ALLOWED or DENIED reply is stored
--   under the replay key (when present) and answered again, with replayed = 1, to every
--   later call with that key within replay_window_ms; nothing is evaluated then.
--
-- State: one string per member key, exactly as the single programs write it. The replay
-- key: one string, the stored reply as comma-separated fields (status, then each row's
-- seven fields).

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- The member functions, and M: each of them under its algorithm code as ARGV spells it.
-- Each is the body of one single program after its time block, given its key's value (RAW)
-- instead of reading it, and handing back the value and TTL (false: keep the key's expiry)
-- of its one SET with its allow, so that the driver below writes only when every member
-- admitted. Generated: a unit test of adapter-redis (programs.rs) holds this section to the
-- single programs, and rewrites it with RL_WRITE_MULTI_LUA=1.
-- @generated begin
-- @member fixed_window begin: generated from rate-fixed-window-v2.lua
local function member_1(A, now, RAW)
  -- One length check stands for the arity and type checks of separate arguments.
  if not A or (#A ~= 33 and #A ~= 57) then
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
  local raw = RAW
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
  return { 'ALLOWED', now, eff, limit, limit - count, 0, reset_at }, value, ttl
end
-- @member fixed_window end
-- @member sliding_window begin: generated from rate-sliding-counter-v2.lua
local function member_2(A, now, RAW)
  -- One length check stands for the arity and type checks of separate arguments.
  if not A or #A ~= 31 then
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
  local raw = RAW
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
    return { 'ALLOWED', now, eff, limit, available - cost, 0, reset_at }, value, ttl
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
end
-- @member sliding_window end
-- @member token_bucket begin: generated from rate-token-bucket-v2.lua
local function member_3(A, now, RAW)
  -- One length check stands for the arity and type checks of separate arguments.
  if not A or #A ~= 40 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local cost, revision, max_regression, grace, capacity, scale, rate =
    struct.unpack('<I7I4I5I5I7I5I7', A)
  -- A field beyond 2^53 unpacks inexactly but still above every bound.
  if cost < 1 or cost > capacity or revision < 1 or capacity > 9007199254740991 or scale < 1
    or rate < 1 or rate > 9007199254740991 or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  -- A product beyond 2^53 is inexact but still above 2^53-1, so this check is exact.
  local capacity_units = capacity * scale
  if capacity_units > 9007199254740991 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  -- Full recovery, ceil(capacity_units / rate), by quotient and remainder.
  local q = (capacity_units - capacity_units % rate) / rate
  if capacity_units - q * rate ~= 0 then
    q = q + 1
  end
  if q > 1099511627775 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end

  -- A wrong key type comes back as an error table, never raised.
  local raw = RAW
  local last, stored
  local over = 0
  if raw then
    local n = type(raw) == 'string' and #raw
    local tag, rev
    if n == 12 then
      tag, last, rev, stored = struct.unpack('<BI6I1I4', raw)
      if tag ~= 0x93 then
        n = nil
      end
    elseif n == 18 then
      tag, last, rev, stored = struct.unpack('<BI6I4I7', raw)
      if tag ~= 0x13 then
        n = nil
      end
    elseif n == 25 then
      tag, last, rev, stored, over = struct.unpack('<BI6I4I7I7', raw)
      -- The most a bucket may owe: what refilling takes 2^40-1 ms to pay (a product beyond
      -- 2^53 is inexact but still above 2^53-1, then capped).
      local most = rate * 1099511627775
      if most > 9007199254740991 then
        most = 9007199254740991
      end
      if tag ~= 0x23 or (over > 0 and stored ~= 0) or over > most - capacity_units then
        n = nil
      end
    else
      n = nil
    end
    -- Six bytes cannot exceed 2^48-1, so last_ms needs no range check.
    if not n or rev ~= revision or stored > capacity_units then
      return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, 0 }
    end
  end

  -- The clock rule: a small regression clamps to last_ms, a larger one changes nothing.
  local eff = now
  if last and now < last then
    if last - now > max_regression then
      return { 'CLOCK_UNSAFE', now, last, capacity, 0, last - now, last }
    end
    eff = last
  end

  -- Units missing from a full bucket, the overdraft included; when the stored bucket is full.
  local missing, full_at = 0, nil
  if last then
    missing = capacity_units - stored + over
    -- Full once elapsed * rate >= missing, after ceil(missing / rate) ms; the product is
    -- formed only when it is smaller.
    local m = (missing - missing % rate) / rate
    if missing - m * rate ~= 0 then
      m = m + 1
    end
    full_at = last + m
    if eff < full_at then
      missing = missing - (eff - last) * rate
    else
      missing = 0
    end
  end
  local tokens = 0
  if missing < capacity_units then
    tokens = capacity_units - missing
  end

  local need = cost * scale
  if need > tokens then
    -- In overdraft, what is owed beyond an empty bucket comes first.
    local short = need - tokens + (missing > capacity_units and missing - capacity_units or 0)
    local retry = (short - short % rate) / rate
    if short - retry * rate ~= 0 then
      retry = retry + 1
    end
    local to_full = (missing - missing % rate) / rate
    if missing - to_full * rate ~= 0 then
      to_full = to_full + 1
    end
    return { 'DENIED', now, eff, capacity, (tokens - tokens % scale) / scale, retry, eff + to_full }
  end

  local left = tokens - need
  local gap = capacity_units - left
  local to_full = (gap - gap % rate) / rate
  if gap - to_full * rate ~= 0 then
    to_full = to_full + 1
  end
  local value
  if revision < 256 and left < 4294967296 then
    value = struct.pack('<BI6I1I4', 0x93, eff, revision, left)
  else
    value = struct.pack('<BI6I4I7', 0x13, eff, revision, left)
  end
  -- The deadline: full again, plus the grace, rounded up to the quantum, on this clock (the
  -- operator %, not math.floor: no function call). A stored state with the same deadline had
  -- it set already: keep it (false). An allow only moves the time it is full again later, so the
  -- stored state's deadline is this one exactly when its own due is past the quantum's start.
  local quantum = (q - q % 8) / 8
  if quantum > grace - max_regression then
    quantum = grace - max_regression
  end
  if quantum < 1 then
    quantum = 1
  end
  local due = eff + to_full + grace
  local deadline = due - due % quantum
  if deadline < due then
    deadline = deadline + quantum
  end
  local ttl = deadline - now
  if full_at and full_at + grace > deadline - quantum then
    ttl = false
  end
  return { 'ALLOWED', now, eff, capacity, (left - left % scale) / scale, 0, eff + to_full }, value, ttl
end
-- @member token_bucket end
-- @member gcra begin: generated from rate-gcra-v2.lua
local function member_4(A, now, RAW)
  -- One length check stands for the arity and type checks of separate arguments.
  if not A or #A ~= 40 then
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
  local raw = RAW
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
  return { 'ALLOWED', now, eff, burst, (tolerance - debt - (tolerance - debt) % interval) / interval, 0, eff + to_reset }, value, ttl
end
-- @member gcra end
-- @member sliding_log begin: generated from rate-sliding-log-v2.lua
local function member_5(A, now, RAW)
  -- One length check stands for the arity and type checks of separate arguments.
  if not A or #A ~= 28 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local cost, revision, max_regression, grace, limit, window = struct.unpack('<I7I4I5I5I2I5', A)
  -- A field beyond 2^53 unpacks inexactly but still above every bound.
  if cost < 1 or cost > limit or revision < 1 or limit > 1000 or window < 1
    or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end

  -- A wrong key type comes back as an error table, never raised.
  local raw = RAW
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
    return { 'ALLOWED', now, eff, limit, available - cost, 0, eff + w }, value, ttl
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
end
-- @member sliding_log end
local M = { ['1'] = member_1, ['2'] = member_2, ['3'] = member_3, ['4'] = member_4, ['5'] = member_5 }
-- @generated end

local argv = ARGV
local h = argv[1]
if not h or #h ~= 5 then
  return { 'INVALID', 0, 0 }
end
local n, window = struct.unpack('<I1I4', h)
local replay = window > 0
if n < 1 or n > 8 or window > 86400000 or #KEYS ~= (replay and n + 1 or n) then
  return { 'INVALID', 0, 0 }
end

-- The stored form of a reply: its status, then each row's seven fields, comma-separated
-- (integers printed exactly; tostring would round beyond 14 digits).
local function encode(status, rows)
  local f = { status }
  for i = 1, n do
    local r = rows[i]
    f[#f + 1] = r[1]
    for j = 2, 7 do
      f[#f + 1] = string.format('%.0f', r[j])
    end
  end
  return table.concat(f, ',')
end

if replay then
  -- A wrong key type comes back as an error table, never raised.
  local stored = redis.pcall('GET', KEYS[n + 1])
  if stored then
    local status = type(stored) == 'string' and string.match(stored, '^(%u+)')
    local rows = {}
    if status == 'ALLOWED' or status == 'DENIED' then
      for s, a, b, c, d, e, g in string.gmatch(stored,
        ',(%u+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)') do
        rows[#rows + 1] = { s, a + 0, b + 0, c + 0, d + 0, e + 0, g + 0 }
      end
    end
    -- Only a value this program wrote for n members encodes back to itself.
    if #rows ~= n or encode(status, rows) ~= stored then
      return { 'STATE_INCOMPATIBLE', 0, n + 1 }
    end
    return { status, 1, 0, unpack(rows, 1, n) }
  end
end

-- Every member is evaluated (reads only); the first refused member, else the first
-- clock-unsafe one, decides the status; only when every member admitted is anything
-- written. Tables are built at their final size (growing one costs a rehash per doubling).
local f8 = false
local rows = { f8, f8, f8, f8, f8, f8, f8, f8 }
local values = { f8, f8, f8, f8, f8, f8, f8, f8 }
local ttls = { f8, f8, f8, f8, f8, f8, f8, f8 }
local refused, unsafe, admitted = 0, 0, true
for i = 1, n do
  local f, a = M[argv[2 * i]], argv[2 * i + 1]
  if not f or not a then
    return { 'INVALID', 0, i }
  end
  -- A wrong key type comes back as an error table, never raised.
  local row, value, ttl = f(a, now, redis.pcall('GET', KEYS[i]))
  rows[i], values[i], ttls[i] = row, value, ttl
  local s = row[1]
  if s == 'INVALID' or s == 'STATE_INCOMPATIBLE' then
    if refused == 0 then
      refused = i
    end
  elseif s == 'CLOCK_UNSAFE' then
    if unsafe == 0 then
      unsafe = i
    end
  elseif s ~= 'ALLOWED' then
    admitted = false
  end
end

local status, index = 'DENIED', 0
if refused > 0 then
  status, index = rows[refused][1], refused
elseif unsafe > 0 then
  status, index = 'CLOCK_UNSAFE', unsafe
elseif admitted then
  status = 'ALLOWED'
  for i = 1, n do
    if ttls[i] then
      redis.call('SET', KEYS[i], values[i], 'PX', string.format('%d', ttls[i]))
    else
      redis.call('SET', KEYS[i], values[i], 'KEEPTTL')
    end
  end
end
if replay and index == 0 then
  redis.call('SET', KEYS[n + 1], encode(status, rows), 'PX', window)
end
return { status, 0, index, unpack(rows, 1, n) }
