-- wrk script: POST /v1/evaluate, 9 of 10 requests for one hot subject, the rest for a random
-- subject over 1,000,000 (written out directly, as in evaluate.lua).
math.randomseed(os.time())
local random = math.random
local head = "POST /v1/evaluate HTTP/1.1\r\nHost: " .. wrk.host
  .. "\r\ncontent-type: application/json\r\nContent-Length: "
request = function()
  local subject = "hot"
  if random(1, 10) == 1 then subject = "user-" .. random(1, 1000000) end
  local body = '{"policy":"api","subject":"' .. subject .. '","cost":1}'
  return head .. #body .. "\r\n\r\n" .. body
end
