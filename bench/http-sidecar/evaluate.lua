-- wrk script: POST /v1/evaluate with a random subject over 1,000,000.
-- The request is written out directly instead of through wrk.format, which builds a header
-- table and formats every line per request: that cost the load generator about 10% of its
-- CPU per request, and the load generator shares the cores with the server it measures.
math.randomseed(os.time())
local random = math.random
local head = "POST /v1/evaluate HTTP/1.1\r\nHost: " .. wrk.host
  .. "\r\ncontent-type: application/json\r\nContent-Length: "
request = function()
  local body = '{"policy":"api","subject":"user-' .. random(1, 1000000) .. '","cost":1}'
  return head .. #body .. "\r\n\r\n" .. body
end
