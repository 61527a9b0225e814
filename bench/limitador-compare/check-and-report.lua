-- wrk script: limitador-server's POST /check_and_report with a random subject over 1,000,000
-- (the twin of bench/http-sidecar/evaluate.lua: same draw, same delta/cost of 1, the
-- request written out the same way).
math.randomseed(os.time())
local random = math.random
local head = "POST /check_and_report HTTP/1.1\r\nHost: " .. wrk.host
  .. "\r\ncontent-type: application/json\r\nContent-Length: "
request = function()
  local body = '{"namespace":"api","values":{"subject":"user-' .. random(1, 1000000)
    .. '"},"delta":1}'
  return head .. #body .. "\r\n\r\n" .. body
end
