-- wrk script: limitador-server's POST /check_and_report with a random subject over 1,000,000
-- (the twin of crates/inbound-web/bench/evaluate.lua: same draw, same delta/cost of 1).
math.randomseed(os.time())
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
request = function()
  local body = '{"namespace":"api","values":{"subject":"user-' .. math.random(1, 1000000) .. '"},"delta":1}'
  return wrk.format("POST", "/check_and_report", nil, body)
end
