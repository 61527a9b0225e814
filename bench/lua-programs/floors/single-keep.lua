-- The floor of a single rate program that keeps an existing key's expiry (the fixed
-- window's rate-fixed-window-v2.lua: a write into the stored state's window keeps it): the
-- floor of single.lua, with SET ... KEEPTTL when GET found the key. On random keys of a
-- small space in one window, as the program then does.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.pcall('GET', KEYS[1])
if raw then
  redis.call('SET', KEYS[1], '0123456789ab', 'KEEPTTL')
else
  redis.call('SET', KEYS[1], '0123456789ab', 'PX', 61000)
end
return { 'ALLOWED', now, now, 100, 99, 0, now + 600 }
