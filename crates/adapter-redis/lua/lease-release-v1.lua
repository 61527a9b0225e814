-- lease-release-v1.lua: one concurrency-lease release, atomically, on one key.
--
-- Mirrors shared-contract's model::concurrency::release: a token that is not held is
-- NOT_HELD; a held token is removed, EXPIRED when its expiry has passed (its place was free
-- already), RELEASED otherwise. No other lease is touched. Calling convention:
-- docs/lua-programs.md.
--
-- KEYS[1]  the leases key; no other key is touched.
-- ARGV:
--   [1] token  32 lowercase hex digits
--   Arguments after [1] are ignored (the test build reads `now` from the last one).
--
-- Reply: {status, server_now_ms}; status a bulk string, server_now_ms an integer.
--   RELEASED            the lease was held; removed
--   EXPIRED             the lease had expired; removed
--   NOT_HELD            no such lease (released before, never acquired, or reclaimed)
--   STATE_INCOMPATIBLE  the key holds another type; nothing written
--   INVALID             the token is missing or malformed; nothing written
--
-- State: as lease-acquire-v1.lua (one sorted set: token -> expiry).

-- @time-source begin
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- @time-source end

local token = ARGV[1]
if not token or #KEYS ~= 1 or #token ~= 32 or not string.find(token, '^[0-9a-f]+$') then
  return { 'INVALID', now }
end
local key = KEYS[1]
local score = redis.pcall('ZSCORE', key, token)
if type(score) == 'table' then
  return { 'STATE_INCOMPATIBLE', now }
end
if not score then
  return { 'NOT_HELD', now }
end
redis.call('ZREM', key, token)
if tonumber(score) <= now then
  return { 'EXPIRED', now }
end
return { 'RELEASED', now }
