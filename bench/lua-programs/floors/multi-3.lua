-- The floor of rate-multi-v2.lua deciding three members: the same redis.calls (TIME, then
-- per member GET by pcall, then per member SET of a 12-byte value, KEEPTTL where GET found
-- the key, as token-bucket members mostly do, else PX) and the same reply
-- shape ({status, replayed, index, row_1, row_2, row_3}, each row a status and six integers).
-- Called with the program's own ARGV (the packed header, then per member its algorithm code
-- and packed argument), which it ignores, so that Redis builds the same Lua strings.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local a = redis.pcall('GET', KEYS[1])
local b = redis.pcall('GET', KEYS[2])
local c = redis.pcall('GET', KEYS[3])
if a then
  redis.call('SET', KEYS[1], '0123456789ab', 'KEEPTTL')
else
  redis.call('SET', KEYS[1], '0123456789ab', 'PX', 61000)
end
if b then
  redis.call('SET', KEYS[2], '0123456789ab', 'KEEPTTL')
else
  redis.call('SET', KEYS[2], '0123456789ab', 'PX', 61000)
end
if c then
  redis.call('SET', KEYS[3], '0123456789ab', 'KEEPTTL')
else
  redis.call('SET', KEYS[3], '0123456789ab', 'PX', 61000)
end
return { 'ALLOWED', 0, 0,
  { 'ALLOWED', now, now, 100, 99, 0, now + 600 },
  { 'ALLOWED', now, now, 100, 99, 0, now + 600 },
  { 'ALLOWED', now, now, 100, 99, 0, now + 600 } }
