-- fleet-heartbeat-v1.lua: one instance's fleet heartbeat, atomically, on one key.
--
-- Each instance of a fleet announces itself by running this program every heartbeat: the
-- members whose announcement expired (expires_at <= now) are dropped, this instance's
-- expiry is set to now + ttl_ms, and the number of members left is the fleet's size. The
-- instances of one fleet are expected to share ttl_ms: the key lives ttl_ms after the latest
-- heartbeat. Calling convention: docs/lua-programs.md.
--
-- KEYS[1]  the fleet key; no other key is touched.
-- ARGV:
--   [1] instance_id  32 lowercase hex digits, random per process
--   [2] ttl_ms       1..=86400000 (decimal digits only)
--   Arguments after [2] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, ...}; status a bulk string, the rest integers in 0..=2^53-1.
--   {FLEET, size, server_now_ms}       announced; size = live members, this one included
--                                      (at least 1)
--   {STATE_INCOMPATIBLE, server_now_ms} the key holds another type; nothing written
--   {INVALID, server_now_ms}           an argument or the key count is missing or out of
--                                      range (also a clock beyond 2^48-1 ms); nothing written
--
-- State: one sorted set of the fleet's members: member the instance id, score its expiry
-- (Unix ms on this server's TIME). The key expires ttl_ms after the latest heartbeat
-- (PEXPIRE), so a fleet whose instances all stopped leaves no state behind.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local id, a2 = ARGV[1], ARGV[2]
if not a2 or #KEYS ~= 1 or #id ~= 32 or not string.find(id, '^[0-9a-f]+$')
  or not string.find(a2, '^%d+$') then
  return { 'INVALID', now }
end
local ttl = a2 + 0
if ttl < 1 or ttl > 86400000 or now > 281474976710655 then
  return { 'INVALID', now }
end
local key = KEYS[1]
-- A wrong key type comes back as an error table, never raised; nothing was removed then.
local dropped = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
if type(dropped) == 'table' then
  return { 'STATE_INCOMPATIBLE', now }
end
redis.call('ZADD', key, now + ttl, id)
local size = redis.call('ZCARD', key)
redis.call('PEXPIRE', key, ttl)
return { 'FLEET', size, now }
