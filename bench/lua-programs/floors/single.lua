-- The floor of a single rate program (rate-*-v2.lua): the same redis.calls (TIME, GET by
-- pcall, SET ... PX of a 12-byte value) and the same reply shape (a status and six
-- integers), with no decision around them. What a program costs above this is its Lua.
-- Called with the program's own ARGV (its one packed argument), which it ignores, so
-- that Redis builds the same Lua strings for both.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.pcall('GET', KEYS[1])
redis.call('SET', KEYS[1], '0123456789ab', 'PX', 61000)
return { 'ALLOWED', now, now, 100, 99, 0, now + 600 }
