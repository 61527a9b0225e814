-- gate-submit-v1.lua: receives one event at one gate, atomically.
--
-- Mirrors shared-contract's gate::GateState::submit step for step (docs/event-gates.md).
-- Calling convention: this header (shared by every gate-*-v1.lua program: the same eight KEYS,
-- ARGV decimal digits, a fixed-arity reply with the status first); docs/lua-programs.md for
-- the rate-limit programs whose discipline these follow.
--
-- KEYS (all share the gate's hash tag {<gate>}; every gate program takes the same eight):
--   [1] clock     string: the gate's scalar clock, bumped with INCR
--   [2] meta      hash: mode, duration (the settings the state was written with), now
--   [3] events    hash: event id -> record "<S|P|I>:<clock>:<submitted_at>:<publish_at>:<terminal_at>:<key>"
--   [4] due       sorted set: incubating event ids, score publish_at (due order)
--   [5] retained  sorted set: terminal event ids, score terminal_at (conditional delete order)
--   [6] windows   hash: event key -> window "<last_at>:<end>:<0|1 last submitted>:<last id>"
--   [7] wends     sorted set: event keys, score window end
--   [8] stream    stream: one entry per status update, id "<clock>-0",
--                 fields s <S|P|I>, i <id>, k <key>, a <at_ms>, p <publish_at_ms>
-- ARGV:
--   [1] mode                     "only_once" | "strictly_once"
--   [2] duration_ms              1..=2^40-1 (decimal digits)
--   [3] max_clock_regression_ms  0..=2^40-1
--   [4] max_events               1..=10^8
--   [5] stream_max_len           1..=2^40-1: XADD MAXLEN ~ bound of the stream
--   [6] event key                1..=256 bytes (checked by the adapter)
--   [7] event id                 1..=128 bytes (checked by the adapter)
--   Arguments after [7] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, effective_now_ms, clock, publish_at_ms, retry_after_ms, text}
--   SUBMITTED           entered the lifecycle; clock and publish_at of the submission; text ''
--   REJECTED            conflicts; clock of the answer; text = conflicts_with (the window's
--                       event). strictly_once: the window moved to this event and the
--                       window's incubating event, if any, was invalidated (its own clock)
--   DUPLICATE           the id is held for this key: nothing changed; clock, publish_at of
--                       the record and text = the stored record
--   ID_REUSED           the id is held for another key (the record's): nothing changed, this
--                       event was not received; fields as for DUPLICATE
--   FULL                max_events events or live windows held; nothing changed (lapsed
--                       windows may have been pruned, which is invisible)
--   CLOCK_UNSAFE        TIME behind the gate's time by more than the allowed regression, or
--                       beyond 2^48-1 ms; retry_after_ms says how long; nothing changed
--   CLOCK_EXHAUSTED     the clock would pass 2^53-1; nothing changed
--   STATE_INCOMPATIBLE  a key of another type, state of another mode or duration, a
--                       malformed record, or a stream ahead of the clock; nothing changed
--   INVALID             an argument is missing or out of range; nothing changed
--   Numbers are integers in 0..=2^53-1; fields that do not apply are 0 (text '').
--
-- State: the eight keys above; none has a TTL: events are never dropped by EXPIRE. Terminal
-- events and lapsed windows are removed by gate-sweep-v1.lua.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local MAX = 9007199254740991
local argv = ARGV
local mode, a2, a3, a4, a5, key, id = argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[7]
if #KEYS ~= 8 or not id or key == '' or id == '' or (mode ~= 'only_once' and mode ~= 'strictly_once')
  or a2 == '' or a3 == '' or a4 == '' or a5 == '' or string.find(a2 .. a3 .. a4 .. a5, '%D') then
  return { 'INVALID', now, 0, 0, 0, 0, '' }
end
local duration, max_regression, max_events, max_len = a2 + 0, a3 + 0, a4 + 0, a5 + 0
if duration < 1 or duration > 1099511627775 or max_regression > 1099511627775 or max_events < 1
  or max_events > 100000000 or max_len < 1 or max_len > 1099511627775 then
  return { 'INVALID', now, 0, 0, 0, 0, '' }
end
if now > 281474976710655 then
  return { 'CLOCK_UNSAFE', now, 0, 0, 0, 1000, '' }
end
local function fmt(n) return string.format('%d', n) end

-- Every read that can meet a wrong key type is a pcall: an error table, never raised.
local meta = redis.pcall('HMGET', KEYS[2], 'mode', 'duration', 'now')
local raw_clock = redis.pcall('GET', KEYS[1])
if meta.err or (type(raw_clock) == 'table' and raw_clock.err) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
end
if (meta[1] and (meta[1] ~= mode or meta[2] ~= a2)) or (raw_clock and string.find(raw_clock, '%D')) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
end
local clock = raw_clock and tonumber(raw_clock) or 0
local last = meta[3] and tonumber(meta[3])
local eff = now
if last and now < last then
  if last - now > max_regression then
    return { 'CLOCK_UNSAFE', now, last, clock, 0, last - now, '' }
  end
  eff = last
end

local rec = redis.pcall('HGET', KEYS[3], id)
if type(rec) == 'table' then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
end
if rec then
  local c, p, k = string.match(rec, '^[SPI]:(%d+):%d+:(%d+):%d*:(.*)$')
  if not c then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
  end
  -- Held for another key: a client error, not a retry; nothing changes either way.
  return { k == key and 'DUPLICATE' or 'ID_REUSED', now, eff, tonumber(c), tonumber(p), 0, rec }
end

-- The stream must be behind the clock, or XADD below would fail after other writes.
local top = redis.pcall('XREVRANGE', KEYS[8], '+', '-', 'COUNT', 1)
if top.err or (top[1] and tonumber(string.match(top[1][1], '^(%d+)')) > clock) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
end

local w = redis.pcall('HGET', KEYS[6], key)
if type(w) == 'table' then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
end
local w_end, w_sub, w_id
if w then
  local e, s, i = string.match(w, '^%d+:(%d+):([01]):(.+)$')
  if not e then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
  end
  w_end, w_sub, w_id = tonumber(e), s == '1', i
end

local function meta_write()
  redis.call('HSET', KEYS[2], 'mode', mode, 'duration', a2, 'now', fmt(eff))
end
local function emit(c, status, eid, at, publish_at)
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', a5, fmt(c) .. '-0', 's', status, 'i', eid, 'k', key,
    'a', fmt(at), 'p', fmt(publish_at))
end

if not w_end or eff >= w_end then
  -- No conflict: submit, if there is room.
  if redis.call('HLEN', KEYS[3]) >= max_events then
    return { 'FULL', now, eff, clock, 0, 0, '' }
  end
  if not w and redis.call('HLEN', KEYS[6]) >= max_events then
    -- Lapsed windows behave like absent ones, so pruning them here is invisible.
    local lapsed = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', fmt(eff))
    for i = 1, #lapsed do
      redis.call('HDEL', KEYS[6], lapsed[i])
      redis.call('ZREM', KEYS[7], lapsed[i])
    end
    if redis.call('HLEN', KEYS[6]) >= max_events then
      return { 'FULL', now, eff, clock, 0, 0, '' }
    end
  end
  if clock >= MAX then
    return { 'CLOCK_EXHAUSTED', now, eff, clock, 0, 0, '' }
  end
  local c = redis.call('INCR', KEYS[1])
  local publish_at = eff + duration
  redis.call('ZADD', KEYS[4], fmt(publish_at), id)
  redis.call('HSET', KEYS[6], key, fmt(eff) .. ':' .. fmt(publish_at) .. ':1:' .. id)
  redis.call('ZADD', KEYS[7], fmt(publish_at), key)
  redis.call('HSET', KEYS[3], id, 'S:' .. fmt(c) .. ':' .. fmt(eff) .. ':' .. fmt(publish_at) .. '::' .. key)
  meta_write()
  emit(c, 'S', id, eff, publish_at)
  return { 'SUBMITTED', now, eff, c, publish_at, 0, '' }
end

-- A conflict.
if mode == 'only_once' then
  -- The window keeps running from the last submitted event: only the clock moves.
  if clock >= MAX then
    return { 'CLOCK_EXHAUSTED', now, eff, clock, 0, 0, '' }
  end
  local c = redis.call('INCR', KEYS[1])
  meta_write()
  return { 'REJECTED', now, eff, c, 0, 0, w_id }
end

-- strictly_once: every check first, then the writes.
if clock + (w_sub and 2 or 1) > MAX then
  return { 'CLOCK_EXHAUSTED', now, eff, clock, 0, 0, '' }
end
local inv_sub, inv_pub
if w_sub then
  -- While a window is live its submitted event incubates.
  local r = redis.call('HGET', KEYS[3], w_id)
  local sub, pub, k
  if r then
    sub, pub, k = string.match(r, '^S:%d+:(%d+):(%d+)::(.*)$')
  end
  if not sub or k ~= key then
    return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0, '' }
  end
  inv_sub, inv_pub = sub, pub
end
if inv_sub then
  local c = redis.call('INCR', KEYS[1])
  redis.call('HSET', KEYS[3], w_id, 'I:' .. fmt(c) .. ':' .. inv_sub .. ':' .. inv_pub .. ':' .. fmt(eff) .. ':' .. key)
  redis.call('ZREM', KEYS[4], w_id)
  redis.call('ZADD', KEYS[5], fmt(eff), w_id)
  emit(c, 'I', w_id, eff, tonumber(inv_pub))
end
local w_new_end = eff + duration
redis.call('HSET', KEYS[6], key, fmt(eff) .. ':' .. fmt(w_new_end) .. ':0:' .. id)
redis.call('ZADD', KEYS[7], fmt(w_new_end), key)
local c = redis.call('INCR', KEYS[1])
meta_write()
return { 'REJECTED', now, eff, c, 0, 0, w_id }
