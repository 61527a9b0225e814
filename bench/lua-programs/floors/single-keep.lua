-- The floor of a single rate program that keeps an existing key's expiry (every one but the
-- sliding log's: a write whose state has the stored state's deadline keeps it): the
-- floor of single.lua, with SET ... KEEPTTL whenever GET found the key (the program keeps
-- it in most such calls, not all: a bucket's deadline moves once a quantum).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.pcall('GET', KEYS[1])
if raw then
  redis.call('SET', KEYS[1], '0123456789ab', 'KEEPTTL')
else
  redis.call('SET', KEYS[1], '0123456789ab', 'PX', 61000)
end
return { 'ALLOWED', now, now, 100, 99, 0, now + 600 }
