-- The floor of rate-settle-v1.lua charging one member after the work (operation 0, one
-- settlement of a hold of nothing): the same redis.calls (TIME, GET by pcall, SET ... PX of
-- a 12-byte value) and the same reply shape ({status, 0, index, row}, the row a status and
-- six integers). Called with the program's own ARGV, which it ignores.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.pcall('GET', KEYS[1])
redis.call('SET', KEYS[1], '0123456789ab', 'PX', 61000)
return { 'ALLOWED', 0, 0, { 'ALLOWED', now, now, 100, 99, 0, now + 600 } }
