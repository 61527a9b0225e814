-- The floor of a single rate program's denial: the same redis.calls (TIME, GET by pcall;
-- nothing written) and the same reply shape (a status and six integers). Called with the
-- program's own ARGV (its one packed argument), which it ignores.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.pcall('GET', KEYS[1])
return { 'DENIED', now, now, 100, 0, 600, now + 600 }
