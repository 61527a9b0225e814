-- wrk script: GET with a random x-api-key over 1,000,000 subjects (written out directly, as in
-- evaluate.lua).
math.randomseed(os.time())
local random = math.random
local head = "GET " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. "\r\nx-api-key: "
request = function()
  return head .. random(1, 1000000) .. "\r\n\r\n"
end
