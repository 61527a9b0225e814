-- The floor of rate-multi-v2.lua denying with three members: the same redis.calls (TIME, a
-- GET by pcall per member; nothing written) and the same reply shape. Called with the
-- program's own ARGV, which it ignores.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local a = redis.pcall('GET', KEYS[1])
local b = redis.pcall('GET', KEYS[2])
local c = redis.pcall('GET', KEYS[3])
return { 'DENIED', 0, 1,
  { 'DENIED', now, now, 100, 0, 600, now + 600 },
  { 'DENIED', now, now, 100, 0, 600, now + 600 },
  { 'DENIED', now, now, 100, 0, 600, now + 600 } }
