-- rate-settle-v1.lua: costs known only after the work (LLM tokens), for 1..=8 members of
-- mixed algorithms in one call: checks and charges after the work, and reservations
-- (reserve an estimate, then settle it with the actual cost, or cancel it).
--
-- Mirrors shared-contract's model: a check is model::evaluate of its cost that writes
-- nothing; a settlement is model::reserve::settle of a hold (its estimate and the effective
-- time it was charged at) with the actual cost, never denied: cost above the estimate is
-- charged past the limit into an overdraft (the state layout "in overdraft"), and the
-- unused part of an estimate comes back only as far as the policy still holds it. A charge
-- after the work is a settlement of a hold of nothing (estimate 0). A reservation is
-- model::multi::reserve_all: an all-or-nothing evaluation of the estimates that, when every
-- member admits, also writes the reservation's record; settle and cancel settle the holds
-- the record keeps (cancel with actual 0) and end it, once (shared-contract's reservation
-- module). Every member is read at one TIME reading. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS     [1..n] the members' state keys, in member order; [n+1] the reservation's record
--          (reserve, settle, cancel). No other key is touched.
-- ARGV     [1] the header, 2 bytes ('<I1I1'): n, 1..=8, the number of members, and the
--          operation: 0 charge, 1 reserve, 2 settle, 3 cancel. Then:
--   charge: three per member: 'check' or 'settle'; the algorithm code (decimal: 1 fixed
--           window, 2 sliding counter, 3 token bucket, 4 GCRA; a check may also name 5,
--           sliding log); the arguments: a check's exactly ARGV[1] of the member's single
--           program (its packed cost, revision, max_clock_regression_ms,
--           cleanup_grace_ms, parameters), a settlement's the same with the actual cost
--           (0..=limit) in the cost's place, followed by the hold, 13 bytes ('<I7I6'):
--           estimate (0..=limit) and at_ms (any value for estimate 0). A fixed window of
--           calendar periods sends its 57-byte arguments (the four bounds), as its single
--           program takes them.
--   reserve: [2] the ttl, 4 bytes ('<I4', 1..=86400000 ms); [3] a blob of the caller's
--           (0..=65535 bytes, kept in the record); then two per member: the algorithm code
--           (1..=4) and the single program's arguments with the estimate as the cost.
--   settle, cancel: two per member: the algorithm code (1..=4) and the single program's
--           arguments with the actual cost (cancel: 0) as the cost; the holds are the
--           record's.
--   Arguments after the last member are ignored (the test build reads `now` from the last).
--
-- Reply: {status, 0, index, row_1, ..., row_n}; the shape of rate-multi-v2.lua's reply:
--   status a bulk string, index 0 or the 1-based member (n+1: the record) the status
--   concerns, and row_i the member's seven-field reply (a nested array): a check's and a
--   reservation's exactly as the single program answers it, a settlement's {ALLOWED,
--   server_now_ms, effective_now_ms, limit, remaining, 0, reset_at_ms} after it. Every row
--   is present unless nothing was evaluated (an INVALID header, operation, algorithm code
--   or missing arguments, the record's statuses below).
--   ALLOWED             every check (reserve: every member) admitted; charge, settle and
--                       cancel: every settlement written; reserve: every member and the
--                       record written
--   DENIED              charge: a check denied, every settlement written all the same (the
--                       work is done); reserve: a member denied, nothing written
--   CLOCK_UNSAFE        member `index` (the first such) saw TIME too far behind its state;
--                       nothing written (a reservation stays outstanding)
--   STATE_INCOMPATIBLE  member `index` (the first refused one) holds state of another type,
--                       schema, algorithm or revision, or a field out of range; or index
--                       n+1: the record key holds something this program did not write for
--                       n members (reserve: anything at all); nothing written
--   INVALID             the header, or member `index`'s operation, algorithm or arguments,
--                       are not acceptable; nothing written
--   UNKNOWN, SETTLED, CANCELLED, EXPIRED (settle and cancel; no rows): the record is gone
--                       (never made, or forgotten one ttl after its expiry), was settled,
--                       was cancelled, or expired unsettled (it stays charged at its
--                       estimates); nothing written
--   STATE_INCOMPATIBLE and INVALID take precedence over CLOCK_UNSAFE.
--
-- State: one string per member key, exactly as the single programs write it: a settlement
-- writes the compact layout when the values fit it, else the wide one, and the layout in
-- overdraft (tag schema 2) exactly when it leaves an overdraft.
-- The record: one string, PX twice the ttl (forgotten one ttl after its expiry; settle and
-- cancel keep its TTL), of unsigned little-endian integers:
--   header, 13 bytes ('<BBI6I4I1'): tag 0x52, status (0 outstanding, 1 settled,
--          2 cancelled), expires_at_ms (TIME at the reservation + ttl), ttl_ms, n
--   n holds, 13 bytes each ('<I7I6'): estimate, effective time it was charged at
--   the caller's blob, prefixed by its length ('<I2')
--   once settled, n results, 49 bytes each ('<I7I7I7I7I7I7I7'): the actual cost, then the
--          settlement's row after its status (server_now_ms ... reset_at_ms)

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

-- The check functions, and M: each of them under its algorithm code as ARGV spells it.
-- They are rate-multi-v2.lua's member functions (the single programs' bodies, handing back
-- the write of an allow instead of making it; a check drops it). Generated: a unit test of
-- adapter-redis (programs.rs) holds this section to the single programs, and rewrites it
-- with RL_WRITE_MULTI_LUA=1.
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

-- The settlement functions, and SETTLE: each under its algorithm code. Each reads its
-- member's value (RAW, as redis.pcall('GET', key) answers it) like its single program
-- (every layout, the same checks), applies the clock rule, and hands back its row, the
-- value to write and its TTL; model::reserve::settle step for step:
--   used    what the policy counts now (a window: its count and overdraft while the
--           window of the state is the current one; a token bucket: units missing from a
--           full bucket after the refill; GCRA: the debt after repayment), overdraft included
--   above   actual >= estimate: used + (actual - estimate) * unit, at most what takes
--           2^40-1 ms to pay down (token bucket, GCRA) or 2^53-1 (windows)
--   below   the unused part (estimate - actual) * unit comes back as far as the policy still
--           holds it: a window while the hold's window is the current one, else nothing;
--           token bucket and GCRA max(0, unused - rate * (effective now - at_ms)); never
--           more than used
-- and the state is written at the effective time with what is counted beyond the limit as
-- its overdraft. The TTL is to the state's deadline as its single program sets it, at least
-- 1 ms (the sliding counter's: the time to reset plus the cleanup grace). A check's TTL of
-- false keeps the key's expiry (SET ... KEEPTTL).

local function settle_1(A, now, RAW)
  local floor = math.floor
  -- 33 bytes of fixed-window arguments (57 with calendar bounds), then the hold.
  if not A or (#A ~= 46 and #A ~= 70) then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local actual, revision, max_regression, grace, limit, window = struct.unpack('<I7I4I5I5I7I5', A)
  local b0, b1, b2, b3, estimate, at
  if #A == 70 then
    b0, b1, b2, b3, estimate, at = struct.unpack('<I6I6I6I6I7I6', A, 34)
    if b0 >= b1 or b1 >= b2 or b2 >= b3 then
      return { 'INVALID', now, 0, 0, 0, 0, 0 }
    end
  else
    estimate, at = struct.unpack('<I7I6', A, 34)
  end
  if limit < 1 or actual > limit or estimate > limit or revision < 1
    or limit > 9007199254740991 or window < 1 or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  -- @state fixed_window begin: generated from rate-fixed-window-v2.lua
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
  -- @state fixed_window end

  -- The window holding the effective time: from the epoch, or among the calendar bounds
  -- sent (none holding it is CLOCK_UNSAFE, as in the single program).
  local start, reset_at
  if not b0 then
    start = eff - (eff - floor(eff / window) * window)
    reset_at = start + window
  elseif eff >= b0 and eff < b1 then
    start, reset_at = b0, b1
  elseif eff >= b1 and eff < b2 then
    start, reset_at = b1, b2
  elseif eff >= b2 and eff < b3 then
    start, reset_at = b2, b3
  else
    return { 'CLOCK_UNSAFE', now, eff, limit, 0, 1000, eff }
  end
  local used = 0
  if last and last >= start then
    used = stored + over
  end
  if actual >= estimate then
    -- A sum beyond 2^53 is inexact but still above 2^53-1, then capped.
    used = used + (actual - estimate)
    if used > 9007199254740991 then
      used = 9007199254740991
    end
  else
    -- Only a hold of this window comes back.
    local back = 0
    if at >= start and at < reset_at then
      back = estimate - actual
    end
    if back > used then
      back = used
    end
    used = used - back
  end
  local count = used < limit and used or limit
  over = used - count
  local value
  if over > 0 then
    value = struct.pack('<BI6I4I7I7', 0x21, eff, revision, count, over)
  elseif revision < 256 and count < 4294967296 then
    value = struct.pack('<BI6I1I4', 0x91, eff, revision, count)
  else
    value = struct.pack('<BI6I4I7', 0x11, eff, revision, count)
  end
  -- The window's one deadline, as the single program sets it (at least 1 ms: now <= eff <
  -- reset_at); a settlement sets it rather than keep it.
  return { 'ALLOWED', now, eff, limit, limit - count, 0, reset_at }, value, reset_at - now + grace
end

local function settle_2(A, now, RAW)
  local floor = math.floor
  if not A or #A ~= 44 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local actual, revision, max_regression, grace, limit, window, estimate, at =
    struct.unpack('<I7I4I5I5I5I5I7I6', A)
  if limit < 1 or actual > limit or estimate > limit or revision < 1 or limit > 9007199254
    or window < 1 or window > 9007199254 or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local S = 1000000 -- fixed-point scale of the previous window's weight
  -- @state sliding_window begin: generated from rate-sliding-counter-v2.lua
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
  -- @state sliding_window end

  local w = window
  local elapsed = eff - floor(eff / w) * w
  local start = eff - elapsed
  -- An overdraft counts only in its own window.
  local previous, used = 0, 0
  if last then
    local last_start = last - (last - floor(last / w) * w)
    if last_start == start then
      previous, used = s_previous, s_current + s_over
    elseif last_start + w == start then
      previous = s_current
    end
  end
  if actual >= estimate then
    used = used + (actual - estimate)
    if used > 9007199254740991 then
      used = 9007199254740991
    end
  else
    local back = 0
    if at - (at - floor(at / w) * w) == start then
      back = estimate - actual
    end
    if back > used then
      back = used
    end
    used = used - back
  end
  local current = used < limit and used or limit
  local over = used - current
  -- weight = ceil((w - elapsed) * S / w); estimate = ceil(previous * weight / S) + current.
  local scaled = (w - elapsed) * S
  local weight = floor(scaled / w)
  if scaled - weight * w ~= 0 then
    weight = weight + 1
  end
  local weighted = previous * weight
  local guess = floor(weighted / S)
  if weighted - guess * S ~= 0 then
    guess = guess + 1
  end
  guess = guess + current
  local to_reset = 0
  if current > 0 then
    to_reset = start + 2 * w - eff
  elseif previous > 0 then
    to_reset = start + w - eff
  end
  local value
  if over > 0 then
    value = struct.pack('<BI6I4I5I5I7', 0x22, eff, revision, previous, current, over)
  elseif revision < 256 and previous < 65536 and current < 65536 then
    value = struct.pack('<BI6I1I2I2', 0x92, eff, revision, previous, current)
  else
    value = struct.pack('<BI6I4I5I5', 0x12, eff, revision, previous, current)
  end
  -- The deadline its counts give, as an allow's (from this clock, at least 1 ms away).
  local ttl = eff + to_reset - now + grace
  return { 'ALLOWED', now, eff, limit, guess < limit and limit - guess or 0, 0, eff + to_reset },
    value, ttl > 0 and ttl or 1
end

local function settle_3(A, now, RAW)
  local floor = math.floor
  if not A or #A ~= 53 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local actual, revision, max_regression, grace, capacity, scale, rate, estimate, at =
    struct.unpack('<I7I4I5I5I7I5I7I7I6', A)
  if capacity < 1 or actual > capacity or estimate > capacity or revision < 1
    or capacity > 9007199254740991 or scale < 1 or rate < 1 or rate > 9007199254740991
    or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local capacity_units = capacity * scale
  if capacity_units > 9007199254740991 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local q = floor(capacity_units / rate)
  if capacity_units - q * rate ~= 0 then
    q = q + 1
  end
  if q > 1099511627775 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  -- The most a bucket may owe: what refilling takes 2^40-1 ms to pay.
  local most = rate * 1099511627775
  if most > 9007199254740991 then
    most = 9007199254740991
  end
  -- @state token_bucket begin: generated from rate-token-bucket-v2.lua
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
  -- @state token_bucket end

  -- Units missing from a full bucket after the refill, the overdraft included.
  local missing = 0
  if last then
    missing = capacity_units - stored + over
    local elapsed = eff - last
    local m = floor(missing / rate)
    if elapsed < m or (elapsed == m and missing - m * rate ~= 0) then
      missing = missing - elapsed * rate
    else
      missing = 0
    end
  end
  if actual >= estimate then
    missing = missing + (actual - estimate) * scale
    if missing > most then
      missing = most
    end
  else
    -- What the bucket refilled since the hold came back by itself already.
    local unused = (estimate - actual) * scale
    local since = eff > at and eff - at or 0
    local d = floor(unused / rate)
    if unused - d * rate ~= 0 then
      d = d + 1
    end
    local back = 0
    if since < d then
      back = unused - since * rate
    end
    if back > missing then
      back = missing
    end
    missing = missing - back
  end
  local short = missing < capacity_units and missing or capacity_units
  local tokens = capacity_units - short
  over = missing - short
  local to_full = floor(missing / rate)
  if missing - to_full * rate ~= 0 then
    to_full = to_full + 1
  end
  local value
  if over > 0 then
    value = struct.pack('<BI6I4I7I7', 0x23, eff, revision, tokens, over)
  elseif revision < 256 and tokens < 4294967296 then
    value = struct.pack('<BI6I1I4', 0x93, eff, revision, tokens)
  else
    value = struct.pack('<BI6I4I7', 0x13, eff, revision, tokens)
  end
  -- The deadline, as the single program sets it (at least 1 ms away); a settlement sets it
  -- rather than keep it.
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
  return { 'ALLOWED', now, eff, capacity, floor(tokens / scale), 0, eff + to_full }, value,
    ttl > 0 and ttl or 1
end

local function settle_4(A, now, RAW)
  local floor = math.floor
  if not A or #A ~= 53 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local actual, revision, max_regression, grace, burst, interval, rate, estimate, at =
    struct.unpack('<I7I4I5I5I7I5I7I7I6', A)
  if burst < 1 or actual > burst or estimate > burst or revision < 1
    or burst > 9007199254740991 or interval < 1 or rate < 1 or rate > 9007199254740991
    or now > 281474976710655 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local tolerance = burst * interval
  if tolerance > 9007199254740991 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  local q = floor(tolerance / rate)
  if tolerance - q * rate ~= 0 then
    q = q + 1
  end
  if q > 1099511627775 then
    return { 'INVALID', now, 0, 0, 0, 0, 0 }
  end
  -- The most a policy may owe: what takes 2^40-1 ms to repay.
  local most = rate * 1099511627775
  if most > 9007199254740991 then
    most = 9007199254740991
  end
  -- @state gcra begin: generated from rate-gcra-v2.lua
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
  -- @state gcra end

  -- The debt after repayment, the overdraft included.
  local debt = 0
  if last then
    local total = stored + over
    local elapsed = eff - last
    local paid = floor(total / rate)
    if total - paid * rate ~= 0 then
      paid = paid + 1
    end
    if elapsed < paid then
      debt = total - elapsed * rate
    end
  end
  if actual >= estimate then
    debt = debt + (actual - estimate) * interval
    if debt > most then
      debt = most
    end
  else
    -- What was repaid since the hold came back by itself already.
    local unused = (estimate - actual) * interval
    local since = eff > at and eff - at or 0
    local d = floor(unused / rate)
    if unused - d * rate ~= 0 then
      d = d + 1
    end
    local back = 0
    if since < d then
      back = unused - since * rate
    end
    if back > debt then
      back = debt
    end
    debt = debt - back
  end
  local held = debt < tolerance and debt or tolerance
  over = debt - held
  local to_reset = floor(debt / rate)
  if debt - to_reset * rate ~= 0 then
    to_reset = to_reset + 1
  end
  local value
  if over > 0 then
    value = struct.pack('<BI6I4I7I7', 0x24, eff, revision, held, over)
  elseif revision < 256 and held < 4294967296 then
    value = struct.pack('<BI6I1I4', 0x94, eff, revision, held)
  else
    value = struct.pack('<BI6I4I7', 0x14, eff, revision, held)
  end
  local left = debt < tolerance and floor((tolerance - debt) / interval) or 0
  -- The deadline, as the single program sets it (at least 1 ms away); a settlement sets it
  -- rather than keep it.
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
  return { 'ALLOWED', now, eff, burst, left, 0, eff + to_reset }, value, ttl > 0 and ttl or 1
end

local SETTLE = { ['1'] = settle_1, ['2'] = settle_2, ['3'] = settle_3, ['4'] = settle_4 }

local argv = ARGV
local h = argv[1]
if not h or #h ~= 2 then
  return { 'INVALID', 0, 0 }
end
local n, op = struct.unpack('<I1I1', h)
-- Reserve, settle and cancel name the reservation's record after the members.
if n < 1 or n > 8 or op > 3 or #KEYS ~= (op > 0 and n + 1 or n) then
  return { 'INVALID', 0, 0 }
end

-- Where the members' arguments start: per member (code, arguments) after `base`; a charge's
-- are (operation, code, arguments) from ARGV[2].
local base = 1
local record
if op == 1 then
  local t, blob = argv[2], argv[3]
  if not t or #t ~= 4 or not blob or #blob > 65535 then
    return { 'INVALID', 0, 0 }
  end
  local ttl = struct.unpack('<I4', t)
  if ttl < 1 or ttl > 86400000 then
    return { 'INVALID', 0, 0 }
  end
  -- A fresh token names no record; anything there is not this reservation's.
  if redis.pcall('GET', KEYS[n + 1]) then
    return { 'STATE_INCOMPATIBLE', 0, n + 1 }
  end
  base = 3
elseif op > 1 then
  -- A wrong key type comes back as an error table, never raised.
  local raw = redis.pcall('GET', KEYS[n + 1])
  if not raw then
    return { 'UNKNOWN', 0, 0 }
  end
  local len = type(raw) == 'string' and #raw or 0
  if len < 15 + 13 * n then
    return { 'STATE_INCOMPATIBLE', 0, n + 1 }
  end
  local tag, status, expires, _, rn = struct.unpack('<BBI6I4I1', raw)
  if tag ~= 0x52 or rn ~= n or status > 2 then
    return { 'STATE_INCOMPATIBLE', 0, n + 1 }
  end
  if status == 1 then
    return { 'SETTLED', 0, 0 }
  elseif status == 2 then
    return { 'CANCELLED', 0, 0 }
  end
  if now >= expires then
    return { 'EXPIRED', 0, 0 }
  end
  record = raw
end

-- Every member is evaluated (reads only); the first refused member, else the first
-- clock-unsafe one, decides the status, and nothing is written. Otherwise a charge writes
-- every settlement; a reservation writes its evaluations and its record only when every
-- member admitted; settle and cancel write every settlement and end the record.
local f8 = false
local rows = { f8, f8, f8, f8, f8, f8, f8, f8 }
local values = { f8, f8, f8, f8, f8, f8, f8, f8 }
local ttls = { f8, f8, f8, f8, f8, f8, f8, f8 }
local refused, unsafe, admitted = 0, 0, true
for i = 1, n do
  local f, a, writes
  if op == 0 then
    local o, code = argv[3 * i - 1], argv[3 * i]
    a = argv[3 * i + 1]
    if o == 'check' then
      f = M[code]
    elseif o == 'settle' then
      f, writes = SETTLE[code], true
    end
  else
    local code = argv[base + 2 * i - 1]
    a = argv[base + 2 * i]
    writes = true
    if op == 1 then
      -- A sliding log takes no reservations.
      f = code ~= '5' and M[code]
    else
      f = SETTLE[code]
      -- The member's hold, as the record keeps it (13 bytes after the 13-byte header).
      if a then
        a = a .. string.sub(record, 1 + 13 * i, 13 + 13 * i)
      end
    end
  end
  if not f or not a then
    return { 'INVALID', 0, i }
  end
  -- A wrong key type comes back as an error table, never raised.
  local row, value, ttl = f(a, now, redis.pcall('GET', KEYS[i]))
  rows[i] = row
  if writes then
    values[i], ttls[i] = value, ttl
  end
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

local status, index = admitted and 'ALLOWED' or 'DENIED', 0
if refused > 0 then
  status, index = rows[refused][1], refused
elseif unsafe > 0 then
  status, index = 'CLOCK_UNSAFE', unsafe
elseif op ~= 1 or admitted then
  for i = 1, n do
    if not values[i] then
    elseif ttls[i] then
      redis.call('SET', KEYS[i], values[i], 'PX', string.format('%d', ttls[i]))
    else
      redis.call('SET', KEYS[i], values[i], 'KEEPTTL')
    end
  end
  if op == 1 then
    -- The record: header, each hold (estimate, effective time charged at), the caller's
    -- blob; kept until one ttl after its expiry.
    local ttl = struct.unpack('<I4', argv[2])
    local blob = argv[3]
    local parts = { struct.pack('<BBI6I4I1', 0x52, 0, now + ttl, ttl, n) }
    for i = 1, n do
      local estimate = struct.unpack('<I7', argv[base + 2 * i])
      parts[i + 1] = struct.pack('<I7I6', estimate, rows[i][3])
    end
    parts[n + 2] = struct.pack('<I2', #blob) .. blob
    redis.call('SET', KEYS[n + 1], table.concat(parts), 'PX', 2 * ttl)
  elseif op == 2 then
    -- Settled: each actual cost and row appended, to answer a retry with.
    local parts = { string.sub(record, 1, 1), '\1', string.sub(record, 3) }
    for i = 1, n do
      local r = rows[i]
      local actual = struct.unpack('<I7', argv[base + 2 * i])
      parts[i + 3] = struct.pack('<I7I7I7I7I7I7I7', actual, r[2], r[3], r[4], r[5], r[6], r[7])
    end
    redis.call('SET', KEYS[n + 1], table.concat(parts), 'KEEPTTL')
  elseif op == 3 then
    redis.call('SET', KEYS[n + 1], string.sub(record, 1, 1) .. '\2' .. string.sub(record, 3),
      'KEEPTTL')
  end
end
return { status, 0, index, unpack(rows, 1, n) }
