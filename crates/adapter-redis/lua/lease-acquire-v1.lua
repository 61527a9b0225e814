-- lease-acquire-v1.lua: one concurrency-lease acquire, atomically, on one key.
--
-- Mirrors shared-contract's model::concurrency::acquire operation for operation: drop the
-- leases that expired (expires_at <= now), then admit iff fewer than limit remain, adding
-- this lease with expires_at = now + lease_ttl_ms. A denial changes nothing. Calling
-- convention: docs/lua-programs.md.
--
-- KEYS[1]  the leases key; no other key is touched.
-- ARGV:
--   [1] token         32 lowercase hex digits, the lease's random part
--   [2] limit         1..=1000000 (decimal digits only)
--   [3] lease_ttl_ms  1..=86400000 (decimal digits only)
--   Arguments after [3] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms, expires_at_ms, limit, remaining, retry_after_ms}; status
-- a bulk string, the rest integers in 0..=2^53-1.
--   ACQUIRED            held until expires_at_ms; remaining = places still free now;
--                       retry_after_ms 0
--   DENIED              limit leases held; nothing changed; retry_after_ms = the earliest
--                       expiry - now; expires_at_ms and remaining 0
--   STATE_INCOMPATIBLE  the key holds another type, or already holds this token; nothing
--                       written
--   INVALID             an argument is missing or out of range (also a clock beyond
--                       2^48-1 ms); nothing written
--   For STATE_INCOMPATIBLE and INVALID every numeric field but server_now_ms is 0.
--
-- State: one sorted set of the subject's leases: member the token, score its expiry (Unix
-- ms on this server's TIME). The key expires with its latest lease (PEXPIRE), so a crashed
-- holder's leases leave no state behind.

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local token, a2, a3 = ARGV[1], ARGV[2], ARGV[3]
if not a3 or #KEYS ~= 1 or #token ~= 32 or not string.find(token, '^[0-9a-f]+$')
  or a2 == '' or a3 == '' or not string.find(a2 .. a3, '^%d+$') then
  return { 'INVALID', now, 0, 0, 0, 0 }
end
local limit, ttl = a2 + 0, a3 + 0
if limit < 1 or limit > 1000000 or ttl < 1 or ttl > 86400000 or now > 281474976710655 then
  return { 'INVALID', now, 0, 0, 0, 0 }
end
local key = KEYS[1]
-- A wrong key type comes back as an error table, never raised; nothing was removed then.
local dropped = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
if type(dropped) == 'table' then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0 }
end
if redis.call('ZSCORE', key, token) then
  return { 'STATE_INCOMPATIBLE', now, 0, 0, 0, 0 }
end
local held = redis.call('ZCARD', key)
if held >= limit then
  local earliest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return { 'DENIED', now, 0, limit, 0, tonumber(earliest[2]) - now }
end
local expires = now + ttl
redis.call('ZADD', key, expires, token)
-- The latest lease: this one, unless lease_ttl was shortened under the same revision.
local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', key, tonumber(latest[2]) - now)
return { 'ACQUIRED', now, expires, limit, limit - held - 1, 0 }
